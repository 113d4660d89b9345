#include "host/peer_backings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.hpp"

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
  for (auto& [key, w] : windows_) ::munmap(w.base, w.length);
  for (auto& [base, length] : retired_) ::munmap(base, length);
}

PeerBackings::View PeerBackings::map(uint32_t pid, uint64_t start_time, uint32_t fd, uint64_t inode, uint64_t length) {
  const uint64_t key = (uint64_t{pid} << 32) | fd;
  std::lock_guard guard(mutex_);
  auto it = windows_.find(key);
  if (it != windows_.end()) {
    if (it->second.start_time == start_time && it->second.inode == inode && it->second.length >= length)
      return View{it->second.base, it->second.length};
    retired_.emplace_back(it->second.base, it->second.length);
    windows_.erase(it);
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
  const int peer_fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) {
    SOFTHCA_DEBUG("cannot open the registered memory of process %u: %s", pid, std::strerror(errno));
    return View{};
  }
  struct stat st {};
  if (::fstat(peer_fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode) {
    ::close(peer_fd);  // the descriptor is another file now
    return View{};
  }
  const uint64_t window = window_for(length);
  void* mem = ::mmap(nullptr, window, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, peer_fd, 0);
  ::close(peer_fd);
  if (mem == MAP_FAILED) return View{};
  windows_.emplace(key, Window{start_time, inode, static_cast<char*>(mem), window});
  return View{static_cast<char*>(mem), window};
}

}  // namespace softhca::host
