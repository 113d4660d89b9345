// A test-and-test-and-set spinlock for short critical sections on the data path
// (per-QP send queue, per-CQ consumer side). It never sleeps in the kernel, so it
// must only guard work that takes nanoseconds and never blocks.
#pragma once

#include <atomic>
#include <cstdint>

namespace softhca {

class SpinLock {
 public:
  void lock() noexcept {
    for (;;) {
      if (!flag_.exchange(true, std::memory_order_acquire)) return;
      while (flag_.load(std::memory_order_relaxed)) __builtin_ia32_pause();
    }
  }
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace softhca
