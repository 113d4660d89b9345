#include "host/peer_backings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "host/host_registry.hpp"

namespace softhca::host {
namespace {

// The smallest window: 4 GiB of address space per peer, no memory.
constexpr uint64_t kMinWindow = uint64_t{4} << 30;

uint64_t window_for(uint64_t length) {
  uint64_t window = kMinWindow;
  while (window < length) window *= 2;
  return window;
}

}  // namespace

PeerBackings::~PeerBackings() {
  for (auto& [key, w] : windows_) {
    ::munmap(w.base, w.length);
    for (const Mapping& m : w.outgrown) ::munmap(m.base, m.length);
  }
  for (const Retired& r : retired_) ::munmap(r.base, r.length);
}

size_t PeerBackings::outgrown() {
  std::lock_guard guard(mutex_);
  size_t n = 0;
  for (const auto& [key, w] : windows_) n += w.outgrown.size();
  return n;
}

size_t PeerBackings::windows() {
  std::lock_guard guard(mutex_);
  return windows_.size();
}

size_t PeerBackings::retired() {
  std::lock_guard guard(mutex_);
  return retired_.size();
}

void PeerBackings::retire_locked(const Window& w, uint64_t now_ns) {
  retired_.push_back(Retired{w.base, w.length, now_ns});
  for (const Mapping& m : w.outgrown) retired_.push_back(Retired{m.base, m.length, now_ns});
}

void PeerBackings::sweep_locked(uint64_t now_ns) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    const auto pid = static_cast<uint32_t>(it->first >> 32);
    if (process_start_time(pid) == it->second.start_time) {
      ++it;
      continue;
    }
    retire_locked(it->second, now_ns);  // its owner died
    it = windows_.erase(it);
  }
  std::erase_if(retired_, [&](const Retired& r) {
    if (now_ns - r.since_ns < grace_ns_) return false;
    ::munmap(r.base, r.length);
    return true;
  });
}

PeerBackings::View PeerBackings::map(uint32_t pid, uint64_t start_time, uint32_t fd, uint64_t inode, uint64_t length) {
  const uint64_t key = (uint64_t{pid} << 32) | fd;
  std::lock_guard guard(mutex_);
  auto it = windows_.find(key);
  if (it != windows_.end() && it->second.start_time == start_time && it->second.inode == inode &&
      it->second.length >= length)
    return View{it->second.base, it->second.length};
  const uint64_t now = monotonic_ns();
  // Too small: the new window takes the old one along, still mapped.
  std::vector<Mapping> outgrown;
  if (it != windows_.end()) {
    if (it->second.start_time == start_time && it->second.inode == inode) {
      outgrown = std::move(it->second.outgrown);
      outgrown.push_back(Mapping{it->second.base, it->second.length});
    } else {
      retire_locked(it->second, now);  // another process's or file's
    }
    windows_.erase(it);
  }
  sweep_locked(now);
  // No new window after all: the old ones go as a dead peer's do.
  auto none = [&] {
    for (const Mapping& m : outgrown) retired_.push_back(Retired{m.base, m.length, now});
    return View{};
  };
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
  const int peer_fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) {
    SOFTHCA_DEBUG("cannot open the registered memory of process %u: %s", pid, std::strerror(errno));
    return none();
  }
  struct stat st {};
  if (::fstat(peer_fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode) {
    ::close(peer_fd);  // the descriptor is another file now
    return none();
  }
  const uint64_t window = window_for(length);
  void* mem = ::mmap(nullptr, window, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, peer_fd, 0);
  ::close(peer_fd);
  if (mem == MAP_FAILED) return none();
  windows_.emplace(key, Window{start_time, inode, static_cast<char*>(mem), window, std::move(outgrown)});
  return View{static_cast<char*>(mem), window};
}

}  // namespace softhca::host
