#include "host/shareable_memory.hpp"

#include <charconv>

#include "host/memory_check.hpp"

namespace softhca::host {
namespace {

// Skips spaces, then returns the next space-separated field.
std::string_view next_field(std::string_view& rest) {
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  const size_t space = rest.find(' ');
  const std::string_view field = rest.substr(0, space);
  rest.remove_prefix(space == std::string_view::npos ? rest.size() : space);
  return field;
}

bool parse_hex(std::string_view text, uint64_t& out) {
  auto r = std::from_chars(text.data(), text.data() + text.size(), out, 16);
  return r.ec == std::errc{} && r.ptr == text.data() + text.size();
}

// The range is shareable when mappings that are each shareable cover it.
class ShareableCoverage {
 public:
  ShareableCoverage(uint64_t begin, uint64_t end) : range_(begin, end) {}
  bool feed(std::string_view text) {
    MapsLine line;
    if (!parse_maps_line(text, line)) return false;
    return range_.feed(line.start, line.end, is_shareable_mapping(line));
  }
  bool verdict() const { return range_.covered(); }

 private:
  RangeCoverage range_;
};

}  // namespace

bool parse_maps_line(std::string_view text, MapsLine& out) {
  std::string_view rest = text;
  const std::string_view range = next_field(rest);
  const size_t dash = range.find('-');
  if (dash == std::string_view::npos || !parse_hex(range.substr(0, dash), out.start) ||
      !parse_hex(range.substr(dash + 1), out.end) || out.end <= out.start)
    return false;
  out.perms = next_field(rest);
  if (out.perms.size() != 4) return false;
  next_field(rest);  // offset
  next_field(rest);  // device
  const std::string_view inode = next_field(rest);
  auto r = std::from_chars(inode.data(), inode.data() + inode.size(), out.inode);
  if (inode.empty() || r.ec != std::errc{}) return false;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  out.path = rest;
  return true;
}

bool is_shareable_mapping(const MapsLine& line) {
  // Read-write, not executable, private; inode 0 is anonymous (hugetlb and
  // shared anonymous memory show a file of their own).
  if (line.perms != "rw-p" || line.inode != 0) return false;
  // Unnamed, the brk heap, or anonymous memory named with PR_SET_VMA; not
  // "[stack]" nor the kernel's special mappings.
  return line.path.empty() || line.path == "[heap]" || line.path.starts_with("[anon:");
}

bool range_shareable_in_maps(std::string_view maps, uint64_t begin, uint64_t end) {
  ShareableCoverage coverage(begin, end);
  while (!maps.empty()) {
    const size_t nl = maps.find('\n');
    if (coverage.feed(maps.substr(0, nl))) break;
    if (nl == std::string_view::npos) break;
    maps.remove_prefix(nl + 1);
  }
  return coverage.verdict();
}

Result<bool> range_shareable_in_process(uint64_t begin, uint64_t end) {
  ShareableCoverage coverage(begin, end);
  if (auto read = scan_process_maps([&](std::string_view line) { return coverage.feed(line); }); !read)
    return fail(read.error());
  return coverage.verdict();
}

}  // namespace softhca::host
