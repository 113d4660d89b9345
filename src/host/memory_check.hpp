// Is a range of this process's address space there, with the protection an MR
// needs? A kernel driver answers this in ib_umem_get by pinning the pages
// (writable when the access allows writes) and fails the registration with
// EFAULT when it cannot. softhca pins nothing, so without this check an MR
// over unmapped or read-only memory would register, and the first operation
// on it would fault inside the library (the shm link memcpy()s when the target
// is this process). The answer comes from /proc/self/maps, read once per call;
// registration is a slow path.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "common/result.hpp"

namespace softhca::host {

// The protection a registration needs from every page of its range.
enum class MemoryNeed {
  kRead,   // no write access: readable pages (pin without FOLL_WRITE)
  kWrite,  // local write, remote write, atomics or MW bind: writable pages
};

// What an MR with these IBV_ACCESS_* flags needs, as the kernel's
// ib_access_writable() decides it.
MemoryNeed memory_need(uint32_t access);

// Checks [addr, addr + length) against `maps`, text in the format of
// /proc/PID/maps (ascending, non-overlapping ranges). Pure, for tests.
// Errors: invalid_argument when the range is empty or wraps around the
// address space (or its page-aligned end does); bad_address when a byte of it
// is not mapped or a mapping lacks the protection `need` asks for.
Result<void> check_range_in_maps(std::string_view maps, uint64_t addr, uint64_t length, MemoryNeed need);

// Decides, mapping by mapping in ascending order, whether mappings cover
// [begin, end) without a hole, each one qualifying (by the caller's rule).
// The verdict is known at the first hole, the first mapping that does not
// qualify, or the one that reaches the end, so a reader can stop there.
class RangeCoverage {
 public:
  RangeCoverage(uint64_t begin, uint64_t end) : cursor_(begin), end_(end) {}
  // The mapping [start, stop); true once the verdict is known.
  bool feed(uint64_t start, uint64_t stop, bool qualifies) {
    if (done_) return true;
    if (stop <= cursor_) return false;  // below the range (or what is already covered)
    if (start > cursor_ || !qualifies) return finish(false);
    cursor_ = stop;
    return cursor_ >= end_ ? finish(true) : false;
  }
  // Covered; a range still open when the mappings ran out ends in a hole.
  bool covered() const { return done_ && ok_; }

 private:
  bool finish(bool ok) {
    done_ = true;
    ok_ = ok;
    return true;
  }
  uint64_t cursor_;
  uint64_t end_;
  bool done_ = false;
  bool ok_ = false;
};

// Feeds the lines of /proc/self/maps, in order and without their newline, to
// `feed` until it returns true (it knows its answer) or the file ends.
// Errors from open/read of that file (never expected).
Result<void> scan_process_maps(const std::function<bool(std::string_view)>& feed);

// The same check against this process's current mappings (/proc/self/maps).
// Also errors from open/read of that file (never expected).
Result<void> check_process_range(const void* addr, uint64_t length, MemoryNeed need);

}  // namespace softhca::host
