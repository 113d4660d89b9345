// The objects that must go before this one can: ibv_dealloc_pd,
// ibv_close_xrcd and ibv_free_dm refuse (EBUSY) while any is attached.
#pragma once

#include <atomic>
#include <cstdint>

namespace softhca::engine {

class UserCount {
 public:
  void attach() { users_.fetch_add(1, std::memory_order_relaxed); }
  void detach() { users_.fetch_sub(1, std::memory_order_relaxed); }
  bool in_use() const { return users_.load(std::memory_order_relaxed) != 0; }

 private:
  std::atomic<uint32_t> users_{0};
};

}  // namespace softhca::engine
