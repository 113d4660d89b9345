#include "host/process_identity.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace softhca::host {
namespace {
std::atomic<uint32_t> g_self_pid{0};
}  // namespace

uint32_t self_pid() {
  uint32_t pid = g_self_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = static_cast<uint32_t>(::getpid());
    g_self_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

void refresh_self_pid() { g_self_pid.store(static_cast<uint32_t>(::getpid()), std::memory_order_relaxed); }

bool pid_alive(uint32_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // /proc/<pid>/stat: "pid (comm) state ...", comm may hold ')' itself.
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  char stat[512];
  const ssize_t n = ::read(fd, stat, sizeof stat - 1);
  ::close(fd);
  if (n <= 0) return true;
  stat[n] = '\0';
  const char* paren = std::strrchr(stat, ')');
  if (paren == nullptr || paren[1] != ' ' || paren[2] == '\0') return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

}  // namespace softhca::host
