// A mutex for locks on the data path that holders may keep across system
// calls: uncontended, lock is one locked instruction and unlock a plain
// store, inline; contended, waiters sleep in the kernel (a futex), as
// std::mutex's do. std::mutex costs two locked instructions and reaches
// them through pthread_mutex_lock/unlock in libc (a call each, through the
// PLT, and the mutex type's checks): 9% of an `ib_write_bw -s 64` client's
// time. SpinLock (spinlock.hpp) is for sections that never block; the QP's
// send queue lock is held while the udp link sends, and a poster spinning
// on it took the core its holder needed.
//
// Why unlock needs no locked instruction. Unlock stores "free" and then
// reads whether anyone sleeps; a waiter counts itself as a sleeper and then
// reads whether the lock is free before it sleeps. Each side is a store
// followed by a load of the other's word, which x86 (and the C++ model)
// may reorder: both could miss the other, and the waiter would sleep
// through the only wake-up. The unlocker would need a full fence between
// its store and load (a locked instruction, ~6 ns here, on every post).
// Instead the rare side pays for both: after counting itself, a waiter
// calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes every
// other thread of the process pass a full fence. Then either the
// unlocker's load comes after that fence and sees the sleeper, or its
// store came before it and the waiter's own check sees the lock free
// (the asymmetric Dekker of liburcu and of the kernel's membarrier(2) page).
// Where the kernel refuses the registration (old kernels, a seccomp filter),
// unlock falls back to a locked exchange, which is a full fence itself.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "common/asymmetric_fence.hpp"

namespace softhca {


class FutexMutex {
 public:
  FutexMutex() = default;
  // Tests construct both kinds; everything else takes the process's.
  explicit FutexMutex(bool unlock_by_store) : unlock_by_store_(unlock_by_store) {}
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

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
    if (unlock_by_store_) [[likely]] {
      state_.store(0, std::memory_order_release);
    } else {
      state_.exchange(0, std::memory_order_seq_cst);
    }
    // Nothing orders this load after the store here: a sleeper's fence does
    // (see the top of the file).
    if (sleepers_.load(std::memory_order_relaxed) != 0) [[unlikely]]
      ::syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

 private:
  [[gnu::noinline]] void lock_contended() noexcept {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // With unlock's store unfenced, sleeping is safe only after every
    // thread passed a fence; where none can be had, wait awake (yielding),
    // which needs no wake-up.
    const bool may_sleep = !unlock_by_store_ || asymmetric_fence::fence_all_threads();
    while (state_.exchange(1, std::memory_order_acquire) != 0) {
      if (may_sleep) {
        ::syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, 1, nullptr, nullptr, 0);
      } else {
        ::sched_yield();
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

  static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
  std::atomic<int> state_{0};     // 0 free, 1 held
  std::atomic<int> sleepers_{0};  // threads in lock_contended (asleep, or about to be)
  bool unlock_by_store_ = asymmetric_fence::kAvailable;
};

}  // namespace softhca
