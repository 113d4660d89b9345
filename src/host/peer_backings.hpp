// The backing files of other processes' registered memory
// (host/memory_backing.hpp), mapped here once per peer so that the shm link
// reaches their shared MRs with memcpy instead of process_vm_writev.
//
// A peer's file only grows; a mapping is a window from offset 0, grown (by a
// new, larger window) when an MR lies beyond it. Windows are never unmapped
// while this object lives, since another thread may be copying through one;
// a window of a peer that died or whose pid came back is set aside with them.
// Mapped pages beyond what the peer registered cost nothing but address space.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace softhca::host {

class PeerBackings {
 public:
  PeerBackings() = default;
  ~PeerBackings();
  PeerBackings(const PeerBackings&) = delete;
  PeerBackings& operator=(const PeerBackings&) = delete;

  // The file that process `pid` (started at `start_time`) holds as
  // descriptor `fd` with inode `inode`, mapped here over at least its first
  // `length` bytes: the window's base (nullptr when the file cannot be
  // opened or is another file) and length. A window stays mapped as long as
  // this object, so callers may keep it.
  struct View {
    char* base = nullptr;
    uint64_t length = 0;
  };
  View map(uint32_t pid, uint64_t start_time, uint32_t fd, uint64_t inode, uint64_t length);

 private:
  struct Window {
    uint64_t start_time;
    uint64_t inode;
    char* base;
    uint64_t length;
  };
  std::mutex mutex_;
  std::unordered_map<uint64_t, Window> windows_;     // (pid << 32 | fd) -> window
  std::vector<std::pair<char*, uint64_t>> retired_;  // unmapped at destruction
};

}  // namespace softhca::host
