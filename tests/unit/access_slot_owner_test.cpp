// Owned access slots (host/access_slot_owner.hpp): a thread keeps one for its
// life and gives it back at exit, at most kOwnedAccessSlots threads own one
// at a time, a forked child starts afresh, and the fence forbids the
// reordering a plain announcement allows. Their use in a registry (an owned
// announcement waited for by the fence, a nested one in a shared slot) is
// tested with the registry, in host_registry_test.cpp.
#include "host/access_slot_owner.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "owned_access_slots.hpp"
#include "store_buffering_litmus.hpp"

namespace softhca::host {
namespace {

TEST(AccessSlotOwner, AThreadKeepsItsSlotAndGivesItBackAtExit) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
  uint32_t first = 0, again = 0;
  std::thread([&] {
    first = access_slot_owner::owned_plus1();
    again = access_slot_owner::owned_plus1();
  }).join();
  EXPECT_GE(first, 1u);
  EXPECT_LE(first, kOwnedAccessSlots);
  EXPECT_EQ(again, first);
  // Threads one after the other never run out: each gives its slot back.
  for (uint32_t i = 0; i < 4 * kOwnedAccessSlots; ++i) {
    uint32_t got = 0;
    std::thread([&] { got = access_slot_owner::owned_plus1(); }).join();
    ASSERT_NE(got, 0u) << "thread " << i << " found every slot taken by threads that had exited";
  }
}

// Threads alive at once: a thread owns the slot its thread pointer hashes
// to, and of the threads that hash to one index, exactly one owns it.
TEST(AccessSlotOwner, ThreadsAliveTogetherOwnEachIndexOnce) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
  constexpr int kThreads = 3 * static_cast<int>(kOwnedAccessSlots);
  std::vector<uint32_t> got(kThreads), index(kThreads);
  std::atomic<int> claimed{0};
  std::atomic<bool> leave{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      index[static_cast<size_t>(t)] = access_slot_owner::index_of(current_thread());
      got[static_cast<size_t>(t)] = access_slot_owner::owned_plus1();
      claimed.fetch_add(1);
      while (!leave.load()) std::this_thread::yield();
    });
  }
  while (claimed.load() != kThreads) std::this_thread::yield();
  leave = true;
  for (std::thread& t : threads) t.join();
  std::vector<int> owners(kOwnedAccessSlots), wanting(kOwnedAccessSlots);
  for (int t = 0; t < kThreads; ++t) {
    const uint32_t i = index[static_cast<size_t>(t)];
    ASSERT_LT(i, kOwnedAccessSlots);
    ++wanting[i];
    if (got[static_cast<size_t>(t)] != 0) {
      EXPECT_EQ(got[static_cast<size_t>(t)], i + 1) << "a thread owns a slot not its own";
      ++owners[i];
    }
  }
  for (uint32_t i = 0; i < kOwnedAccessSlots; ++i)
    EXPECT_EQ(owners[i], wanting[i] != 0 ? 1 : 0) << "index " << i << ", wanted by " << wanting[i] << " threads";
}

// A forked child has one thread; the parent's other owners are not in it.
TEST(AccessSlotOwner, AForkedChildStartsAfresh) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan does not follow a fork of a process that runs threads";
#endif
  // The parent's slots taken by live threads (three per index on average,
  // so most likely the forking thread's own index too), then a fork.
  std::atomic<int> claimed{0};
  std::atomic<bool> leave{false};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 3 * kOwnedAccessSlots; ++t) {
    threads.emplace_back([&] {
      access_slot_owner::owned_plus1();
      claimed.fetch_add(1);
      while (!leave.load()) std::this_thread::yield();
    });
  }
  while (claimed.load() != static_cast<int>(3 * kOwnedAccessSlots)) std::this_thread::yield();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The parent's owners are not here: this thread gets a slot.
    ::_exit(access_slot_owner::owned_plus1() != 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  leave = true;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child found no slot free";
}

#if defined(__x86_64__)
// The mechanism: an announcement is a plain store followed by loads; the
// fence side stores, calls membarrier(GLOBAL_EXPEDITED), then loads. The
// store-buffering outcome must never show (this process registered when
// its first thread claimed a slot).
TEST(AccessSlotOwner, TheFenceForbidsWhatPlainAnnouncementsAllow) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
  const long unfenced = litmus::both_missed(10'000, nullptr);
  const long fenced = litmus::both_missed(10'000, access_slot_owner::fence_owners_everywhere);
  std::printf("store buffering without the fence: %ld of 10000 rounds; with it: %ld of 10000\n", unfenced, fenced);
  EXPECT_EQ(fenced, 0);
}
#endif

}  // namespace
}  // namespace softhca::host
