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

}  // namespace
}  // namespace softhca::transport
