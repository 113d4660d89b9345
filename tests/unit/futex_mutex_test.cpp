// FutexMutex (common/futex_mutex.hpp): mutual exclusion, and waiters that
// sleep and are woken, with holders that block as the send path does.
#include "common/futex_mutex.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace softhca {
namespace {

TEST(FutexMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  FutexMutex m;
  ASSERT_TRUE(m.try_lock());
  EXPECT_FALSE(m.try_lock());
  m.unlock();
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

// Four threads add to a counter that is not atomic, each increment split in
// a read and a write; every 64th time the holder sleeps inside (as a sender
// in a system call), so the others sleep on the futex and must be woken.
TEST(FutexMutex, ContendedIncrementsAreNeitherLostNorStuck) {
  FutexMutex m;
  uint64_t counter = 0;
  constexpr int kThreads = 4;
  constexpr int kEach = 20'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard guard(m);
        const uint64_t seen = counter;
        if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
        counter = seen + 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kEach);
  EXPECT_TRUE(m.try_lock()) << "free once every holder left";
  m.unlock();
}

}  // namespace
}  // namespace softhca
