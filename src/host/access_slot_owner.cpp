#include "host/access_slot_owner.hpp"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "common/log.hpp"

namespace softhca::host::access_slot_owner {
namespace {

long membarrier(int cmd) { return ::syscall(SYS_membarrier, cmd, 0, 0); }

// 1 once the kernel registered this process for global expedited
// membarriers, -1 if it refused; 0 not asked yet (and again after fork).
std::atomic<int> g_registered{0};

void give_back_at_exit(void* value) {
  const auto plus1 = reinterpret_cast<uintptr_t>(value);
  if (plus1 - 1 < kOwnedAccessSlots) g_owner[plus1 - 1].store(0, std::memory_order_release);
}

// The child of a fork has one thread: the parent's other owners are not in
// it, and whether the registration carried over is not for us to assume.
// Everything is asked afresh.
void forget_after_fork() {
  for (auto& owner : g_owner) owner.store(0, std::memory_order_relaxed);
  g_registered.store(0, std::memory_order_relaxed);
}

struct ExitKey {
  pthread_key_t key{};
  bool ok = false;
  ExitKey() {
    ok = pthread_key_create(&key, give_back_at_exit) == 0;
    if (ok) ok = pthread_atfork(nullptr, nullptr, forget_after_fork) == 0;
  }
  // Unloaded with threads still alive: no destructor may run into unmapped code.
  ~ExitKey() {
    if (ok) pthread_key_delete(key);
  }
};

bool registered() {
  int state = g_registered.load(std::memory_order_acquire);
  if (state == 0) {
    state = membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0 ? 1 : -1;
    g_registered.store(state, std::memory_order_release);
  }
  return state == 1;
}

}  // namespace

uint32_t claim(uintptr_t thread, uint32_t index) {
  static ExitKey exit_key;
  if (!exit_key.ok || !registered()) return 0;
  uintptr_t free = 0;
  if (!g_owner[index].compare_exchange_strong(free, thread, std::memory_order_acq_rel)) return 0;
  if (pthread_setspecific(exit_key.key, reinterpret_cast<void*>(uintptr_t{index} + 1)) != 0) {
    g_owner[index].store(0, std::memory_order_release);
    return 0;
  }
  return index + 1;
}

bool fence_owners_everywhere() {
  if (membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0) return true;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    SOFTHCA_WARN("membarrier(GLOBAL_EXPEDITED) refused here: a deregistration cannot fence other processes' "
                 "announcements made without a locked instruction");
  return false;
}

}  // namespace softhca::host::access_slot_owner
