#include "host/process_identity.hpp"

#include <unistd.h>

#include <atomic>

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

}  // namespace softhca::host
