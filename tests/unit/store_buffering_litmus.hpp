// A store-buffering litmus test for asymmetric fences: one thread stores x
// then loads y with only a compiler barrier between (the hot path: an
// unlock's store then its look at the sleepers, an announcement then the
// key table); the other stores y, calls the heavy fence, then loads x.
// Both loads seeing 0 is what x86 allows without the fence; with it, never.
#pragma once

#if defined(__x86_64__)
#include <gtest/gtest.h>
#include <x86intrin.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace softhca::litmus {

struct Lines {
  alignas(64) std::atomic<int> x{0};
  alignas(64) std::atomic<int> y{0};
  alignas(64) std::atomic<long> round{-1};
  std::atomic<uint64_t> start_at{0};  // both sides begin the round at this TSC value
  alignas(64) std::atomic<long> done{0};
};

// Both threads leave their wait at once: each spins to the same TSC value,
// published with the round, so that the two stores and loads overlap.
inline void wait_until(uint64_t tsc) {
  while (__rdtsc() < tsc) {
  }
}

// How many of `rounds` rounds ended with both loads 0. `heavy_fence`: the
// slow side's fence (false from it fails the test); empty: the compiler's
// order only.
inline long both_missed(long rounds, const std::function<bool()>& heavy_fence) {
  Lines t;
  std::vector<int> seen_y(static_cast<size_t>(rounds)), seen_x(static_cast<size_t>(rounds));
  std::thread fast([&] {
    for (long r = 0; r < rounds; ++r) {
      while (t.round.load(std::memory_order_acquire) != r) {
      }
      wait_until(t.start_at.load(std::memory_order_relaxed));
      t.x.store(1, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      seen_y[static_cast<size_t>(r)] = t.y.load(std::memory_order_relaxed);
      t.done.fetch_add(1, std::memory_order_acq_rel);
    }
  });
  for (long r = 0; r < rounds; ++r) {
    t.x.store(0, std::memory_order_relaxed);
    t.y.store(0, std::memory_order_relaxed);
    const uint64_t start = __rdtsc() + 20'000;  // a few microseconds: time for the other side to see the round
    t.start_at.store(start, std::memory_order_relaxed);
    t.round.store(r, std::memory_order_release);
    wait_until(start);
    t.y.store(1, std::memory_order_relaxed);
    if (heavy_fence) {
      EXPECT_TRUE(heavy_fence());
    } else {
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler's order only
    }
    seen_x[static_cast<size_t>(r)] = t.x.load(std::memory_order_relaxed);
    while (t.done.load(std::memory_order_acquire) != r + 1) {
    }
  }
  fast.join();
  long missed = 0;
  for (long r = 0; r < rounds; ++r) missed += seen_x[static_cast<size_t>(r)] == 0 && seen_y[static_cast<size_t>(r)] == 0;
  return missed;
}

}  // namespace softhca::litmus
#endif
