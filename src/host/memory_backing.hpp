// Registered memory that other processes of the host can map (issue #11):
// the pages of a registered range are moved into one shared memory file of
// this process (a memfd), mapped at the same addresses with the same
// contents, so that a peer that maps the file reaches them with plain loads
// and stores instead of a process_vm_writev per operation.
//
// Only the pages a registered range covers whole move: a partial page at
// either end also holds the application's other objects (a heap buffer's
// neighbours, a mutex another thread is taking), and those must never be
// write-protected, not even for the moment of the move. A thread that blocks
// SIGSEGV would be killed by the kernel for storing there, and a system call
// writing there would fail with EFAULT. Peers reach the partial pages by
// copying (process_vm_*), as they reach memory that cannot move.
//
// Moving pages is safe against this process's other threads: WriteGuard
// holds their stores off while the pages are copied into the file and the
// file is mapped over them. Only private anonymous read-write memory is moved
// (host/shareable_memory.hpp); anything else is answered not_supported and
// keeps the copying path.
//
// fork(): the child must not share the parent's pages (it would see the
// parent's later stores, and the parent its). Before fork the pages are
// copied aside into private memory, which the child then moves in place of
// the shared mapping (its own copy-on-write pages, as of the fork); the parent
// drops the copies. Stores racing the fork itself may or may not be in the
// child's copy, as with a kernel's copy of pinned pages.
//
// One object per process (MemoryBacking::process()): the file, the signal
// handler of WriteGuard and the fork handlers are per process by nature.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "common/result.hpp"

namespace softhca::host {

// Whole pages of this process's address space, and where the file holds them.
struct SharedPages {
  uint64_t begin = 0;   // page-aligned address here
  uint64_t length = 0;  // a multiple of the page size
  uint64_t offset = 0;  // of `begin` in the file
};

class MemoryBacking {
 public:
  static MemoryBacking& process();

  // Moves the whole pages inside [addr, addr + length) into the file, or
  // finds them there already (counted: each share() needs its unshare()).
  // Errors: not_supported when the memory cannot be moved (no whole page in
  // the range, not private anonymous read-write, or overlapping only part of
  // pages moved before);
  // invalid_argument for an empty or wrapping range; those of memfd_create,
  // ftruncate, mprotect and mmap otherwise.
  Result<SharedPages> share(const void* addr, uint64_t length);

  // Drops one use of pages returned by share(); the last one moves them back
  // to private anonymous memory (when the application still maps them there)
  // and frees their space in the file. Contents are kept.
  void unshare(const SharedPages& pages);

  // The file (-1 before the first share) and its inode, which a peer compares
  // after opening /proc/PID/fd/FD to know it has the file it was told of.
  int fd() const;
  ino_t inode() const;

  // Ranges moved and still in use, for tests and `softhca stat`.
  size_t ranges() const;

 private:
  MemoryBacking() = default;

  struct Range {
    uint64_t end;
    uint64_t offset;
    uint32_t uses;
  };

  struct Snapshot {
    uint64_t begin;
    uint64_t length;
    void* copy;
  };
  static void before_fork();
  static void after_fork_in_parent();
  static void after_fork_in_child();

  Result<void> open_file_locked();
  Result<uint64_t> allocate_locked(uint64_t length);
  void free_locked(uint64_t offset, uint64_t length);
  Result<void> move_in_locked(uint64_t begin, uint64_t end, uint64_t offset);
  void move_out_locked(uint64_t begin, uint64_t end, uint64_t offset);

  mutable std::mutex mutex_;
  int fd_ = -1;
  ino_t inode_ = 0;
  uint64_t file_size_ = 0;
  std::map<uint64_t, uint64_t> holes_;  // offset -> length, free space below file_size_
  std::map<uint64_t, Range> ranges_;    // begin -> range
  std::vector<Snapshot> snapshots_;     // between before_fork and after_fork_*
};

}  // namespace softhca::host
