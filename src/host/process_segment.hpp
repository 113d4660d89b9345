// The process segment: the part of a process's softhca state that initiators in
// other processes operate on directly (shared CQ rings, receive queues, QP
// responder state, the owner's event ring). It is a sparse memfd; peers map it
// through /proc/PID/fd/N, which needs the same permission as process_vm_writev
// (same user), so the trust boundary is the Unix user.
//
// Everything inside is addressed by offset from the segment base, because each
// process maps it at a different address.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "common/result.hpp"

namespace softhca::host {

inline constexpr uint64_t kSegmentBytes = 1ULL << 32;  // address space only; pages appear when touched
inline constexpr uint64_t kSegmentHeaderBytes = 1 << 16;

// A segment's allocator: power-of-two size classes with free lists, owner-only.
class SegmentAllocator {
 public:
  explicit SegmentAllocator(uint64_t first, uint64_t limit) : next_(first), limit_(limit) {}
  // Returns an offset, or 0 when the segment is exhausted.
  uint64_t allocate(uint64_t bytes);
  void release(uint64_t offset, uint64_t bytes);

 private:
  static int size_class(uint64_t bytes);
  std::mutex mutex_;
  uint64_t next_;
  uint64_t limit_;
  std::unordered_multimap<int, uint64_t> free_;
};

class ProcessSegment {
 public:
  static Result<ProcessSegment*> create();
  ~ProcessSegment();

  int fd() const { return fd_; }
  char* base() const { return base_; }
  template <typename T>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  uint64_t offset_of(const void* p) const { return static_cast<uint64_t>(static_cast<const char*>(p) - base_); }

  // Zeroed shared memory of `bytes`, 64-byte aligned; 0 on exhaustion.
  uint64_t allocate(uint64_t bytes);
  void release(uint64_t offset, uint64_t bytes);

 private:
  ProcessSegment(int fd, char* base) : fd_(fd), base_(base), allocator_(kSegmentHeaderBytes, kSegmentBytes) {}
  int fd_;
  char* base_;
  SegmentAllocator allocator_;
};

// The segments of other processes this process has mapped, by (pid, fd).
class PeerSegments {
 public:
  // The base of pid's segment, mapping it on first use; nullptr if it cannot be
  // mapped (the process is gone).
  char* map(uint32_t pid, uint32_t fd, uint64_t start_time);
  ~PeerSegments();

 private:
  struct Mapping {
    char* base;
    uint64_t start_time;
  };
  std::mutex mutex_;
  std::unordered_map<uint64_t, Mapping> mappings_;
};

}  // namespace softhca::host
