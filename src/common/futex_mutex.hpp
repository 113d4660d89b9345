// A mutex for locks on the data path that holders may keep across system
// calls: uncontended, lock and unlock are one locked instruction each,
// inline; contended, waiters sleep in the kernel (a futex), as std::mutex's
// do. std::mutex costs the same two locked instructions but reaches them
// through pthread_mutex_lock/unlock in libc (a call each, through the PLT,
// and the mutex type's checks): 9% of an `ib_write_bw -s 64` client's time.
// SpinLock (spinlock.hpp) is for sections that never block; the QP's send
// queue lock is held while the udp link sends, and a poster spinning on it
// took the core its holder needed.
//
// The states: 0 free, 1 locked, 2 locked and perhaps waited for (unlock
// then wakes one waiter). A waiter sets 2 before it sleeps, so no wake-up
// is lost; after waking it takes the lock as 2, since others may still wait.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace softhca {

class FutexMutex {
 public:
  void lock() noexcept {
    int expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed)) [[likely]]
      return;
    lock_contended();
  }
  bool try_lock() noexcept {
    int expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]]
      ::syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

 private:
  void lock_contended() noexcept {
    while (state_.exchange(2, std::memory_order_acquire) != 0)
      ::syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
  }

  static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
  std::atomic<int> state_{0};
};

}  // namespace softhca
