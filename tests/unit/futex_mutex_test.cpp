// FutexMutex (common/futex_mutex.hpp): mutual exclusion, and waiters that
// sleep and are woken, with holders that block as the send path does; for
// both unlocks (a plain store, the sleepers fencing every thread; a locked
// exchange, where the kernel gives no such fence). A wake-up lost to the
// unfenced store would leave a thread asleep for good: the test would hang
// until ctest's time limit and fail.
#include "common/futex_mutex.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "store_buffering_litmus.hpp"

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
// `nap_every`: the holder sleeps inside every that many sections (0: never).
void contend(bool unlock_by_store, int threads_n, int each, int nap_every) {
  FutexMutex m(unlock_by_store);
  uint64_t counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < each; ++i) {
        std::lock_guard guard(m);
        const uint64_t seen = counter;
        if (nap_every != 0 && i % nap_every == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
        counter = seen + 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t(threads_n) * uint64_t(each));
  EXPECT_TRUE(m.try_lock()) << "free once every holder left";
  m.unlock();
}

class FutexMutexUnlock : public ::testing::TestWithParam<bool> {};

TEST_P(FutexMutexUnlock, ContendedIncrementsAreNeitherLostNorStuck) { contend(GetParam(), 4, 20'000, 64); }

// Sections of a few instructions, never napping: waiters go to sleep while
// holders unlock at full speed, the race the fence is there for.
TEST_P(FutexMutexUnlock, ShortSectionsUnderContentionWakeEveryWaiter) { contend(GetParam(), 4, 200'000, 0); }

INSTANTIATE_TEST_SUITE_P(Both, FutexMutexUnlock, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ByStore" : "ByExchange";
                         });

#if defined(__x86_64__)
TEST(FutexMutex, TheSleepersFenceForbidsWhatPlainAccessesAllow) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here";
  const long unfenced = litmus::both_missed(20'000, nullptr);
  const long fenced = litmus::both_missed(20'000, asymmetric_fence::fence_all_threads);
  // Without the fence the outcome shows up when both threads run at once
  // (how often depends on the machine; it is only reported).
  RecordProperty("unfenced_both_missed", static_cast<int>(unfenced));
  std::printf("store buffering without the fence: %ld of 20000 rounds; with it: %ld of 20000\n", unfenced, fenced);
  EXPECT_EQ(fenced, 0);
}
#endif

TEST(FutexMutex, ThisKernelFencesEveryThreadOnRequest) {
  // Not a requirement (unlock falls back to an exchange), but where the
  // kernel has membarrier the fast unlock must be the one in use.
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here";
  EXPECT_TRUE(asymmetric_fence::fence_all_threads());
}

}  // namespace
}  // namespace softhca
