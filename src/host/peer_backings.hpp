// The backing files of other processes' registered memory
// (host/memory_backing.hpp), mapped here once per peer so that the shm link
// reaches their shared MRs with memcpy instead of process_vm_writev.
//
// A peer's file only grows; a mapping is a window from offset 0, grown (by a
// new, larger window) when an MR lies beyond it. A window that a larger one
// replaced stays mapped as long as its peer lives: callers keep windows (a
// channel keeps its target's) and go on using one while it is long enough
// for what they reach, and it maps the same file, so it costs address
// space only. Once its peer died (checked whenever a window is looked up
// anew) every window of the peer is retired: another thread may still be
// copying through it, so it is unmapped only `grace` later, at a later
// lookup or at destruction. (The shm link uses a window only after seeing
// its owner alive, so a copy under way when the owner died is the only
// user left.) Until then a dead peer's registered memory stays allocated.
// Mapped pages beyond what the peer registered cost nothing but address
// space.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace softhca::host {

class PeerBackings {
 public:
  explicit PeerBackings(uint64_t grace_ns = 10'000'000'000) : grace_ns_(grace_ns) {}
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

  // Windows in use, outgrown by a larger one of the same live peer, and
  // retired but still mapped, for tests and stat.
  size_t windows();
  size_t outgrown();
  size_t retired();

 private:
  struct Mapping {
    char* base;
    uint64_t length;
  };
  struct Window {
    uint64_t start_time;
    uint64_t inode;
    char* base;
    uint64_t length;
    std::vector<Mapping> outgrown;  // smaller windows of the same file, still mapped
  };
  struct Retired {
    char* base;
    uint64_t length;
    uint64_t since_ns;
  };
  void retire_locked(const Window& w, uint64_t now_ns);
  void sweep_locked(uint64_t now_ns);

  const uint64_t grace_ns_;
  std::mutex mutex_;
  std::unordered_map<uint64_t, Window> windows_;  // (pid << 32 | fd) -> window
  std::vector<Retired> retired_;
};

}  // namespace softhca::host
