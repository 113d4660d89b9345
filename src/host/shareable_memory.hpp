// Which memory of this process may be re-backed by a shared memory file
// (host/memory_backing.hpp), so that peers on the host reach it with plain
// loads and stores: private anonymous read-write pages only (the heap, malloc
// and mmap(MAP_PRIVATE | MAP_ANONYMOUS) buffers). Everything else keeps the
// copying path: file-backed and MAP_SHARED mappings (others may map them
// already, and replacing them would cut that sharing), hugetlb (its page size
// is not ours to copy in 4 KiB steps), the stack (it grows and is
// thread-owned), executable or read-only pages, and anything unknown.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/result.hpp"

namespace softhca::host {

// One line of /proc/PID/maps, the fields the decision needs.
struct MapsLine {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string_view perms;  // "rw-p"
  uint64_t inode = 0;
  std::string_view path;  // empty for an unnamed anonymous mapping
};

// Parses one line; false if it is not a mapping line.
bool parse_maps_line(std::string_view line, MapsLine& out);

// Whether this mapping's pages may be re-backed.
bool is_shareable_mapping(const MapsLine& line);

// Whether every page of [begin, end) (page-aligned, begin < end) lies in
// shareable mappings of `maps`, text in the format of /proc/PID/maps. Pure,
// for tests.
bool range_shareable_in_maps(std::string_view maps, uint64_t begin, uint64_t end);

// The same against this process's current mappings. Errors: those of reading
// /proc/self/maps (never expected).
Result<bool> range_shareable_in_process(uint64_t begin, uint64_t end);

}  // namespace softhca::host
