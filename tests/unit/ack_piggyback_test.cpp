// link/udp/ack_piggyback: when a responder's plain ACKs wait for the next
// request to carry them, and when they stop waiting. Times in ns on a
// virtual clock.
#include "link/udp/ack_piggyback.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace softhca::udp {
namespace {

constexpr uint64_t kUs = 1'000;
constexpr uint64_t kMs = 1'000'000;

TEST(AckPiggyback, ACKsLeaveAtOnceUntilARequestCouldHaveCarriedThem) {
  AckPiggyback p;
  EXPECT_FALSE(p.holding());
  // A stream: ACKs go, no request of ours follows.
  for (uint64_t t = kMs; t < 2 * kMs; t += 10 * kUs) p.sent_alone(t);
  EXPECT_FALSE(p.holding());
  // A request long after the last ACK was no chance missed.
  p.request_leaves(2 * kMs + AckPiggyback::kOpportunityNs + kUs, false);
  EXPECT_FALSE(p.holding());
  // A reply a few microseconds after the ACK was.
  p.sent_alone(3 * kMs);
  p.request_leaves(3 * kMs + 5 * kUs, false);
  EXPECT_TRUE(p.holding());
}

TEST(AckPiggyback, ARequestWithoutACKsBeforeItChangesNothing) {
  AckPiggyback p;
  p.request_leaves(kMs, false);
  p.request_leaves(kMs + kUs, false);
  EXPECT_FALSE(p.holding());
}

TEST(AckPiggyback, OneMissedChanceCountsOnce) {
  // Once a request took the opportunity, the next request must see new
  // ACKs sent alone to count again.
  AckPiggyback p;
  p.sent_alone(kMs);
  p.request_leaves(kMs + kUs, false);
  ASSERT_TRUE(p.holding());
  p.released_alone(2 * kMs);
  EXPECT_FALSE(p.holding());
  // The release itself sent ACKs alone: a reply right after shows holding pays again.
  p.request_leaves(2 * kMs + 3 * kUs, false);
  EXPECT_TRUE(p.holding());
}

TEST(AckPiggyback, CarriedACKsKeepItHolding) {
  AckPiggyback p;
  p.sent_alone(kMs);
  p.request_leaves(kMs + kUs, false);
  for (uint64_t t = 2 * kMs; t < 3 * kMs; t += 20 * kUs) {
    p.request_leaves(t, true);
    EXPECT_TRUE(p.holding());
  }
}

TEST(AckPiggyback, HeldACKsAreDueWellBeforeAPeersTailProbe) {
  // A softhca requester probes 200 us after its last packet at the soonest;
  // held ACKs fall due, and a look of the link thread that left the
  // sockets to pollers comes, well within that.
  static_assert(AckPiggyback::kHoldNs <= 100 * kUs);
  EXPECT_FALSE(AckPiggyback::due(kMs, kMs + AckPiggyback::kHoldNs - 1));
  EXPECT_TRUE(AckPiggyback::due(kMs, kMs + AckPiggyback::kHoldNs));
}

}  // namespace
}  // namespace softhca::udp
