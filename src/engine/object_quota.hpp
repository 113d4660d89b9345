// How many objects of one kind this process may hold at once: the maximum
// ibv_query_device reports for it. A device at its limit fails the create
// verb with ENOMEM; CQs, SRQs and PDs use only this process's own memory, so
// they are counted here, per process (QPNs and MR keys are host-wide and the
// host registry's slot tables bound them; see limits.hpp).
#pragma once

#include <atomic>
#include <cstdint>

namespace softhca::engine {

class ObjectQuota {
 public:
  explicit constexpr ObjectQuota(uint32_t max) : max_(max) {}

  // Takes `n` units (one object, or bytes of a byte quota); false when that
  // would pass `max`.
  bool try_take(uint32_t n = 1) {
    uint32_t live = live_.load(std::memory_order_relaxed);
    do {
      if (n > max_ || live > max_ - n) return false;
    } while (!live_.compare_exchange_weak(live, live + n, std::memory_order_relaxed));
    return true;
  }
  // Returns units taken by try_take().
  void give_back(uint32_t n = 1) { live_.fetch_sub(n, std::memory_order_relaxed); }

  uint32_t live() const { return live_.load(std::memory_order_relaxed); }
  uint32_t max() const { return max_; }

 private:
  const uint32_t max_;
  std::atomic<uint32_t> live_{0};
};

}  // namespace softhca::engine
