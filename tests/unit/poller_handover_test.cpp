// link/udp/poller_handover: when the udp link's thread leaves the sockets
// to busy-polling application threads, and when it takes them back. Times
// in ns on a virtual clock; CPU times are what the link thread would read.
#include "link/udp/poller_handover.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <utility>

namespace softhca::udp {
namespace {

using Look = PollerHandover::Look;
constexpr uint64_t kUs = 1'000;
constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kSustain = 2 * kMs;
constexpr int kTid = 4242;

// Polls every `step` from `from` to `to` (exclusive); returns the last poll's time.
uint64_t poll_from(PollerHandover& h, uint64_t from, uint64_t to, uint64_t step = 5 * kUs) {
  uint64_t t = from;
  for (; t < to; t += step) h.polled(t, kTid);
  return t - step;
}

TEST(PollerHandover, NeverWithoutPollsOrWhenTurnedOff) {
  PollerHandover h(kSustain);
  EXPECT_EQ(h.look(10 * kMs), Look::kKeep);
  PollerHandover off(0);
  poll_from(off, kMs, 10 * kMs);
  EXPECT_EQ(off.look(10 * kMs), Look::kKeep);
}

TEST(PollerHandover, OnlyAfterPollingForTheSustainedTime) {
  PollerHandover h(kSustain);
  const uint64_t last = poll_from(h, kMs, kMs + kSustain - 10 * kUs);
  EXPECT_EQ(h.look(last), Look::kKeep);
  h.polled(kMs + kSustain, kTid);
  EXPECT_EQ(h.look(kMs + kSustain), Look::kPolling);
  EXPECT_EQ(h.poller(), kTid);
  // Still the pollers' as long as they polled within kPauseNs.
  EXPECT_EQ(h.look(kMs + kSustain + PollerHandover::kPauseNs), Look::kPolling);
  EXPECT_EQ(h.look(kMs + kSustain + PollerHandover::kPauseNs + 1), Look::kPaused);
}

TEST(PollerHandover, APollAfterTheLookReadItsClockIsAPollJustNow) {
  // The link thread reads the clock, then a poller polls, then it looks.
  PollerHandover h(kSustain);
  const uint64_t last = poll_from(h, kMs, 4 * kMs);
  h.polled(last + 3 * kUs, kTid);
  EXPECT_EQ(h.look(last + kUs), Look::kPolling);
}

TEST(PollerHandover, AGapLongerThanTheStretchGapStartsOver) {
  PollerHandover h(kSustain);
  const uint64_t last = poll_from(h, kMs, 4 * kMs);
  const uint64_t back = last + PollerHandover::kStretchGapNs + kUs;
  h.polled(back, kTid);
  EXPECT_EQ(h.look(back), Look::kKeep);
  // A shorter gap (a poller preempted for a while) keeps the stretch.
  PollerHandover g(kSustain);
  const uint64_t g_last = poll_from(g, kMs, 4 * kMs);
  const uint64_t soon = g_last + PollerHandover::kStretchGapNs - kUs;
  g.polled(soon, kTid);
  EXPECT_EQ(g.look(soon), Look::kPolling);
}

TEST(PollerHandover, ARestingPollerEndsItAtOnce) {
  PollerHandover h(kSustain);
  const uint64_t last = poll_from(h, kMs, 4 * kMs);
  ASSERT_EQ(h.look(last), Look::kPolling);
  h.resting();
  EXPECT_EQ(h.look(last), Look::kKeep);
  // The next poll starts a new stretch.
  h.polled(last + kUs, kTid);
  EXPECT_EQ(h.look(last + kUs), Look::kKeep);
}

TEST(PollerHandover, APollerThatRanWithoutPollingWhilePacketsWaitedBacksOff) {
  PollerHandover h(kSustain);
  const uint64_t last = poll_from(h, kMs, 4 * kMs);
  ASSERT_EQ(h.look(last), Look::kPolling);
  h.sample(last, 50 * kMs);
  // One look later it has run the whole millisecond, not polling.
  const uint64_t now = last + PollerHandover::kLookEveryNs;
  ASSERT_EQ(h.look(now), Look::kPaused);
  EXPECT_EQ(h.paused(now, 50 * kMs + PollerHandover::kLookEveryNs, true), PollerHandover::kFirstBackoffNs);
  // No handing over during the backoff, polling or not...
  const uint64_t during = now + PollerHandover::kFirstBackoffNs - kMs;
  const uint64_t polled = poll_from(h, during - 3 * kMs, during);
  EXPECT_EQ(h.look(polled), Look::kKeep);
  // ...and again after it.
  const uint64_t after = now + PollerHandover::kFirstBackoffNs;
  const uint64_t again = poll_from(h, after, after + kSustain + kUs);
  EXPECT_EQ(h.look(again), Look::kPolling);
  // A second such pause doubles the backoff.
  h.sample(again, 80 * kMs);
  const uint64_t later = again + PollerHandover::kLookEveryNs;
  EXPECT_EQ(h.paused(later, 80 * kMs + PollerHandover::kLookEveryNs, true), 2 * PollerHandover::kFirstBackoffNs);
}

TEST(PollerHandover, APauseLongAfterTheLastStartsShortAgain) {
  PollerHandover h(kSustain);
  uint64_t t = kMs;
  uint64_t cpu = 50 * kMs;
  // Pauses that follow each other double...
  const auto bad_pause = [&](uint64_t at) {
    const uint64_t last = poll_from(h, at, at + kSustain + kUs);
    EXPECT_EQ(h.look(last), Look::kPolling);
    h.sample(last, cpu);
    const uint64_t now = last + PollerHandover::kLookEveryNs;
    cpu += PollerHandover::kLookEveryNs;
    EXPECT_EQ(h.look(now), Look::kPaused);
    return std::pair{now, h.paused(now, cpu, true)};
  };
  auto [now, pause] = bad_pause(t);
  EXPECT_EQ(pause, PollerHandover::kFirstBackoffNs);
  std::tie(now, pause) = bad_pause(now + pause);
  EXPECT_EQ(pause, 2 * PollerHandover::kFirstBackoffNs);
  std::tie(now, pause) = bad_pause(now + pause);
  EXPECT_EQ(pause, 4 * PollerHandover::kFirstBackoffNs);
  // ...one long after the last is a fluke: short again.
  t = now + PollerHandover::kForgetAfterBackoffs * 8 * PollerHandover::kFirstBackoffNs + kMs;
  std::tie(now, pause) = bad_pause(t);
  EXPECT_EQ(pause, PollerHandover::kFirstBackoffNs);
}

TEST(PollerHandover, APollerThatDidNotRunOrLeftNothingWaitingCostsNothing) {
  PollerHandover h(kSustain);
  uint64_t last = poll_from(h, kMs, 4 * kMs);
  h.sample(last, 50 * kMs);
  uint64_t now = last + PollerHandover::kLookEveryNs;
  // Preempted: no CPU time since the sample. Packets waited, but for
  // nobody that could have taken them.
  EXPECT_EQ(0u, h.paused(now, 50 * kMs, true));
  // It polls again: the stretch goes on, handed over at once.
  h.polled(now + kUs, kTid);
  EXPECT_EQ(h.look(now + kUs), Look::kPolling);
  // Ran, but nothing waited.
  h.sample(now + kUs, 60 * kMs);
  now += kUs + PollerHandover::kLookEveryNs;
  EXPECT_EQ(0u, h.paused(now, 60 * kMs + PollerHandover::kLookEveryNs, false));
  // CPU time unknown (the thread ended).
  h.polled(now + kUs, kTid);
  h.sample(now + kUs, 70 * kMs);
  now += kUs + PollerHandover::kLookEveryNs;
  EXPECT_EQ(0u, h.paused(now, 0, true));
  h.polled(now + kUs, kTid);
  EXPECT_EQ(h.look(now + kUs), Look::kPolling);
}

TEST(PollerHandover, TimePollingBeforeThePauseDoesNotCountAsRunningWithoutPolling) {
  // Polled through most of the look interval, then preempted: the CPU
  // time since the sample is the polling's.
  PollerHandover h(kSustain);
  const uint64_t start = poll_from(h, kMs, 4 * kMs);
  h.sample(start, 50 * kMs);
  const uint64_t last = poll_from(h, start, start + 700 * kUs);
  const uint64_t now = start + PollerHandover::kLookEveryNs;
  ASSERT_EQ(h.look(now), Look::kPaused);
  EXPECT_EQ(0u, h.paused(now, 50 * kMs + (last - start), true));
}

}  // namespace
}  // namespace softhca::udp
