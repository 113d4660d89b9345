// Throughput of the packet-level transport on a lossy path, in virtual time
// (lossy_path.hpp): issue #9's bar, ib_write_bw at 1% loss keeping at least
// half its lossless bandwidth, checked where it is deterministic.
#include <gtest/gtest.h>

#include <cstdio>

#include "lossy_path.hpp"

namespace softhca::transport {
namespace {

LossyPathResult run_path(const LossyPathConfig& c, const char* name) {
  LossyPath path(c);
  const LossyPathResult r = path.run();
  std::printf("[ lossy    ] %s: %s\n", name, r.summary().c_str());
  return r;
}

TEST(LossyPath, ALosslessRunResendsNothingAndKeepsTheLinkBusy) {
  LossyPathConfig c;
  c.loss_per_10000 = 0;
  const LossyPathResult r = run_path(c, "lossless");
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.retransmitted, 0u);
  EXPECT_EQ(r.probes + r.timeouts, 0u);
  // 64 MiB at about 1 us per KiB packet: the window covers the round trip.
  EXPECT_LT(r.elapsed_ns, 75'000'000u);
}

// 30 us each way and 1 us per packet: the path holds about 60 packets, and
// a window of 128 keeps it busy. Halving the window on each sequence NAK
// held it near 20 packets at 1% loss (4.1 times as long as lossless); cut
// to what the path holds instead, the go-back-N resend behind each loss is
// what is left (about twice the lossless time, issue #9's bar being 2).
TEST(LossyPath, OnePercentLossTakesLittleMoreThanTwiceTheLosslessTime) {
  LossyPathConfig c;
  c.loss_per_10000 = 0;
  const LossyPathResult lossless = run_path(c, "lossless");
  ASSERT_TRUE(lossless.finished);
  for (uint64_t seed : {3, 4, 5}) {
    c.loss_per_10000 = 100;
    c.seed = seed;
    const LossyPathResult lossy = run_path(c, "1% loss");
    ASSERT_TRUE(lossy.finished);
    EXPECT_LE(lossy.elapsed_ns, 9 * lossless.elapsed_ns / 4) << "seed " << seed;
  }
}

// Between two softhca ends the responder keeps packets past a gap and the
// requester resends only the holes it reports (transport/selective.hpp):
// a loss costs its packet and no round trip of idle link.
TEST(LossyPath, SelectiveRecoveryKeepsOnePercentLossNearTheLosslessTime) {
  LossyPathConfig c;
  c.selective = true;
  c.loss_per_10000 = 0;
  const LossyPathResult lossless = run_path(c, "selective, lossless");
  ASSERT_TRUE(lossless.finished);
  EXPECT_EQ(lossless.retransmitted, 0u);
  for (uint64_t seed : {3, 4, 5}) {
    c.loss_per_10000 = 100;
    c.seed = seed;
    const LossyPathResult lossy = run_path(c, "selective, 1% loss");
    ASSERT_TRUE(lossy.finished);
    EXPECT_LE(lossy.elapsed_ns, 3 * lossless.elapsed_ns / 2) << "seed " << seed;
    EXPECT_LE(lossy.retransmitted, 3 * lossy.lost_requests) << "seed " << seed;
  }
}

}  // namespace
}  // namespace softhca::transport
