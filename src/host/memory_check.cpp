#include "host/memory_check.hpp"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <string>

namespace softhca::host {
namespace {

// x86-64, the one target: the page size ib_umem_get aligns the end to.
constexpr uint64_t kPageSize = 4096;

// Reads the range and permissions of each maps line and feeds them to a
// RangeCoverage: a mapping qualifies when it grants the needed access.
class Coverage {
 public:
  Coverage(uint64_t begin, uint64_t end, MemoryNeed need) : range_(begin, end), need_(need) {}

  // Returns true once the verdict is known.
  bool feed(std::string_view line) {
    uint64_t start = 0;
    uint64_t stop = 0;
    const char* p = line.data();
    const char* last = line.data() + line.size();
    auto r = std::from_chars(p, last, start, 16);
    if (r.ec != std::errc{} || r.ptr == last || *r.ptr != '-') return false;  // not a mapping line
    r = std::from_chars(r.ptr + 1, last, stop, 16);
    if (r.ec != std::errc{} || last - r.ptr < 3 || *r.ptr != ' ') return false;
    const char* perms = r.ptr + 1;
    const bool allowed = need_ == MemoryNeed::kWrite ? perms[1] == 'w' : perms[0] == 'r';
    return range_.feed(start, stop, allowed);
  }

  Result<void> verdict() const {
    if (range_.covered()) return {};
    return fail(std::errc::bad_address);
  }

 private:
  RangeCoverage range_;
  MemoryNeed need_;
};

// The range [addr, end) or invalid_argument, as ib_umem_get rejects it.
Result<uint64_t> range_end(uint64_t addr, uint64_t length) {
  if (length == 0) return fail(std::errc::invalid_argument);
  const uint64_t end = addr + length;
  if (end < addr) return fail(std::errc::invalid_argument);
  const uint64_t aligned = (end + kPageSize - 1) & ~(kPageSize - 1);
  if (aligned < end) return fail(std::errc::invalid_argument);
  return end;
}

}  // namespace

MemoryNeed memory_need(uint32_t access) {
  // Atomics modify memory and a bound window may grant writes, so the kernel
  // pins writable for those too, not only for the two write flags.
  constexpr uint32_t kWritable =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
  return (access & kWritable) ? MemoryNeed::kWrite : MemoryNeed::kRead;
}

Result<void> check_range_in_maps(std::string_view maps, uint64_t addr, uint64_t length, MemoryNeed need) {
  auto end = range_end(addr, length);
  if (!end) return fail(end.error());
  Coverage coverage(addr, *end, need);
  while (!maps.empty()) {
    const size_t nl = maps.find('\n');
    const std::string_view line = maps.substr(0, nl);
    if (coverage.feed(line)) break;
    if (nl == std::string_view::npos) break;
    maps.remove_prefix(nl + 1);
  }
  return coverage.verdict();
}

Result<void> scan_process_maps(const std::function<bool(std::string_view)>& feed) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  // The kernel hands out whole lines per read(); a line split by our buffer
  // is carried over. Reading stops once `feed` has its answer, so a range low
  // in the address space costs a fraction of the file.
  std::string buf(64 * 1024, '\0');
  size_t kept = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data() + kept, buf.size() - kept);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return fail(static_cast<std::errc>(err));
    }
    if (n == 0) break;
    const std::string_view chunk(buf.data(), kept + static_cast<size_t>(n));
    size_t pos = 0;
    for (size_t nl; (nl = chunk.find('\n', pos)) != std::string_view::npos; pos = nl + 1) {
      if (feed(chunk.substr(pos, nl - pos))) {
        ::close(fd);
        return {};
      }
    }
    kept = chunk.size() - pos;
    std::memmove(buf.data(), buf.data() + pos, kept);
    if (kept == buf.size()) buf.resize(buf.size() * 2);  // a line longer than the buffer (a huge path)
  }
  ::close(fd);
  return {};
}

Result<void> check_process_range(const void* addr, uint64_t length, MemoryNeed need) {
  const uint64_t begin = reinterpret_cast<uint64_t>(addr);
  auto end = range_end(begin, length);
  if (!end) return fail(end.error());
  Coverage coverage(begin, *end, need);
  if (auto read = scan_process_maps([&](std::string_view line) { return coverage.feed(line); }); !read)
    return read;
  return coverage.verdict();
}

}  // namespace softhca::host
