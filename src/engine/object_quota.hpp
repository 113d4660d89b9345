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

  // Takes one unit; false when `max` are already taken.
  bool try_take() {
    uint32_t live = live_.load(std::memory_order_relaxed);
    do {
      if (live >= max_) return false;
    } while (!live_.compare_exchange_weak(live, live + 1, std::memory_order_relaxed));
    return true;
  }
  // Returns a unit taken by try_take().
  void give_back() { live_.fetch_sub(1, std::memory_order_relaxed); }

  uint32_t live() const { return live_.load(std::memory_order_relaxed); }
  uint32_t max() const { return max_; }

 private:
  const uint32_t max_;
  std::atomic<uint32_t> live_{0};
};

}  // namespace softhca::engine
