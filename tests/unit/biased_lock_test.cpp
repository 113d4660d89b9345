// BiasedLock (common/biased_lock.hpp): when the bias is granted, that other
// threads revoke it once and for good, and that the lock excludes in every
// phase -- before the bias, under it, and while it is being revoked with
// the owner inside or about to enter.
#include "common/biased_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/futex_mutex.hpp"
#include "common/spinlock.hpp"

namespace softhca {
namespace {

template <class Lock>
void take(Lock& lock, uint32_t times) {
  for (uint32_t i = 0; i < times; ++i) {
    std::lock_guard guard(lock);
  }
}

TEST(BiasedLock, TheThreadThatTakesItAloneGetsTheBiasAfterAStreak) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here: no bias";
  BiasedLock<SpinLock> lock;
  take(lock, BiasedLock<SpinLock>::kClaimAfter - 1);
  EXPECT_FALSE(lock.biased());
  take(lock, 1);
  EXPECT_TRUE(lock.biased());
  EXPECT_FALSE(lock.revoked());
  take(lock, 1000);  // by the bias now
  EXPECT_TRUE(lock.biased());
}

TEST(BiasedLock, AnInterruptedStreakStartsAgain) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here: no bias";
  BiasedLock<SpinLock> lock;
  take(lock, BiasedLock<SpinLock>::kClaimAfter - 1);
  std::thread([&] { take(lock, 1); }).join();
  take(lock, BiasedLock<SpinLock>::kClaimAfter - 1);
  EXPECT_FALSE(lock.biased()) << "the other thread's turn broke the first streak";
  take(lock, 1);
  EXPECT_TRUE(lock.biased());
}

TEST(BiasedLock, AnotherThreadRevokesTheBiasForGood) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here: no bias";
  BiasedLock<FutexMutex> lock;
  take(lock, BiasedLock<FutexMutex>::kClaimAfter);
  ASSERT_TRUE(lock.biased());
  std::thread([&] { take(lock, 1); }).join();
  EXPECT_TRUE(lock.revoked());
  take(lock, 10 * BiasedLock<FutexMutex>::kClaimAfter);  // the old owner, alone again
  EXPECT_FALSE(lock.biased()) << "a revoked bias is never granted again";
  std::thread([&] { take(lock, 10 * BiasedLock<FutexMutex>::kClaimAfter); }).join();
  EXPECT_FALSE(lock.biased());
}

TEST(BiasedLock, NeverGrantedWhereAskedNot) {
  BiasedLock<SpinLock> lock(false);
  take(lock, 10 * BiasedLock<SpinLock>::kClaimAfter);
  EXPECT_FALSE(lock.biased());
  EXPECT_TRUE(lock.revoked());
}

// The revoker must wait for an owner that is inside by the bias: it gets
// the lock only after the owner has left (the owner stays in for a while
// after the revoker has started, so that the revoker actually waits; the
// check does not depend on how long).
TEST(BiasedLock, ARevokerWaitsForTheOwnerToLeave) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here: no bias";
  BiasedLock<FutexMutex> lock;
  take(lock, BiasedLock<FutexMutex>::kClaimAfter);
  ASSERT_TRUE(lock.biased());
  std::atomic<bool> revoker_started{false};
  std::atomic<bool> owner_left{false};
  bool revoker_saw_owner_left = false;
  lock.lock();
  std::thread revoker([&] {
    revoker_started.store(true);
    std::lock_guard guard(lock);
    revoker_saw_owner_left = owner_left.load();
  });
  while (!revoker_started.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  owner_left.store(true);
  lock.unlock();
  revoker.join();
  EXPECT_TRUE(revoker_saw_owner_left);
  EXPECT_TRUE(lock.revoked());
}

// Rounds of a fresh lock: the owner earns the bias, then it and a second
// thread start at once and each add `each` to a counter whose increment is
// split into a load and a store (a lost update shows an overlap), and
// each section checks that nobody else is in it. The
// second thread's first lock revokes the bias while the owner is entering
// and leaving as fast as it can: the race the fence is there for.
// The second thread waits a different while in each round (up to
// `max_delay` pauses) before its first lock, so that the revocation falls
// at all points of the owner's run rather than before its first entry.
template <class Inner, class Hooks = NoLockHooks>
void race_revocations(int rounds, int each, uint32_t max_delay) {
  struct Round {
    BiasedLock<Inner, Hooks> lock;
    std::atomic<uint64_t> counter{0};
    std::atomic<bool> occupied{false};  // someone is inside: a second one is an overlap
    std::atomic<int> overlaps{0};
  };
  std::vector<std::unique_ptr<Round>> all;
  for (int r = 0; r < rounds; ++r) all.push_back(std::make_unique<Round>());
  std::atomic<int> ready{-1};  // the round both threads may start
  std::atomic<int> biased_rounds{0};
  auto add = [](Round& round, int times) {
    for (int i = 0; i < times; ++i) {
      std::lock_guard guard(round.lock);
      if (round.occupied.exchange(true, std::memory_order_relaxed)) round.overlaps.fetch_add(1);
      const uint64_t seen = round.counter.load(std::memory_order_relaxed);
      for (int spin = 0; spin < 16; ++spin) asymmetric_fence::light_barrier();  // a section of some length
      round.counter.store(seen + 1, std::memory_order_relaxed);
      round.occupied.store(false, std::memory_order_relaxed);
    }
  };
  std::atomic<int> owner_round{-1};
  std::thread owner([&] {
    for (int r = 0; r < rounds; ++r) {
      Round& round = *all[static_cast<size_t>(r)];
      add(round, static_cast<int>(BiasedLock<Inner>::kClaimAfter));
      biased_rounds.fetch_add(round.lock.biased() ? 1 : 0);
      owner_round.store(r, std::memory_order_release);
      while (ready.load(std::memory_order_acquire) < r) {
      }
      add(round, each);
    }
  });
  for (int r = 0; r < rounds; ++r) {
    Round& round = *all[static_cast<size_t>(r)];
    while (owner_round.load(std::memory_order_acquire) < r) {
    }
    ready.store(r, std::memory_order_release);
    const uint32_t delay = (static_cast<uint32_t>(r) * 2654435761u >> 8) % max_delay;
    for (uint32_t i = 0; i < delay; ++i) __builtin_ia32_pause();
    add(round, each);
  }
  owner.join();
  int exact = 0;
  int overlaps = 0;
  for (const auto& round : all) {
    exact += round->counter.load() == BiasedLock<Inner>::kClaimAfter + 2 * uint64_t(each);
    overlaps += round->overlaps.load();
  }
  EXPECT_EQ(overlaps, 0);
  EXPECT_EQ(exact, rounds);
  if (asymmetric_fence::kAvailable) {
    EXPECT_EQ(biased_rounds.load(), rounds);
    int revoked = 0;
    for (const auto& round : all) revoked += round->lock.revoked();
    EXPECT_EQ(revoked, rounds);
  }
}

TEST(BiasedLock, RevocationRacingTheOwnerLosesNoUpdateOverSpinLock) { race_revocations<SpinLock>(2000, 200, 512); }
TEST(BiasedLock, RevocationRacingTheOwnerLosesNoUpdateOverFutexMutex) { race_revocations<FutexMutex>(2000, 200, 512); }

// The owner checks the bias, and before it stores "inside" a revoker comes,
// finds it outside and takes the lock. The owner's store and second check
// must then send it to the inner lock, not into the section. The hook
// holds the owner in that gap until the revoker is inside.
struct GapHook {
  static inline std::atomic<bool> armed{false};
  static inline std::atomic<bool> owner_in_gap{false};
  static inline std::atomic<bool> revoker_inside{false};
  static void between_check_and_entry() {
    if (!armed.exchange(false)) return;
    owner_in_gap.store(true);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!revoker_inside.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  }
};

TEST(BiasedLock, ARevokerThatLooksBeforeTheOwnersStoreKeepsTheOwnerOut) {
  if (!asymmetric_fence::kAvailable) GTEST_SKIP() << "membarrier(PRIVATE_EXPEDITED) refused here: no bias";
  BiasedLock<FutexMutex, GapHook> lock;
  take(lock, BiasedLock<FutexMutex, GapHook>::kClaimAfter);
  ASSERT_TRUE(lock.biased());
  std::atomic<bool> owner_entered{false};
  bool owner_entered_while_revoker_inside = true;
  GapHook::armed.store(true);
  std::thread revoker([&] {
    while (!GapHook::owner_in_gap.load()) std::this_thread::yield();
    std::lock_guard guard(lock);
    GapHook::revoker_inside.store(true);
    // Stay inside a while: an owner that wrongly entered shows up by then.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (!owner_entered.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    owner_entered_while_revoker_inside = owner_entered.load();
  });
  {
    std::lock_guard guard(lock);  // checks the bias, waits in the gap, then enters
    owner_entered.store(true);
  }
  revoker.join();
  EXPECT_TRUE(GapHook::revoker_inside.load()) << "the revoker never got in while the owner was in the gap";
  EXPECT_FALSE(owner_entered_while_revoker_inside);
  EXPECT_TRUE(lock.revoked());
}

// Many threads on one lock after the bias: the first to come revokes it,
// the rest use the inner lock; the owner keeps taking it throughout.
TEST(BiasedLock, ContendedAfterTheBiasIncrementsAreExact) {
  BiasedLock<FutexMutex> lock;
  take(lock, BiasedLock<FutexMutex>::kClaimAfter);
  uint64_t counter = 0;
  constexpr int kThreads = 4;
  constexpr int kEach = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard guard(lock);
        ++counter;
      }
    });
  }
  for (int i = 0; i < kEach; ++i) {
    std::lock_guard guard(lock);
    ++counter;
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t(kThreads + 1) * kEach);
}

}  // namespace
}  // namespace softhca
