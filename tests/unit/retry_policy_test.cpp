// The requester's retry budget, by count (transport/retry_policy.hpp).
#include "transport/retry_policy.hpp"

#include <gtest/gtest.h>

namespace softhca::transport {
namespace {

// RNR NAKs a WQE meets before it gives up; each NAK but the last is followed by a retry.
int rnr_naks_until_give_up(uint32_t rnr_retry) {
  uint8_t left = static_cast<uint8_t>(rnr_retry);
  for (int naks = 1; naks <= 1000; ++naks)
    if (after_rnr_nak(rnr_retry, left) == RetryVerdict::kGiveUp) return naks;
  return -1;  // never gives up
}

TEST(RetryPolicy, RnrRetryNSendsAgainExactlyNTimes) {
  for (uint32_t n = 0; n < kRnrRetryForever; ++n) EXPECT_EQ(rnr_naks_until_give_up(n), static_cast<int>(n) + 1) << "rnr_retry " << n;
}

TEST(RetryPolicy, RnrRetrySevenNeverGivesUp) { EXPECT_EQ(rnr_naks_until_give_up(kRnrRetryForever), -1); }

TEST(RetryPolicy, RetryCntNRetransmitsExactlyNTimes) {
  for (uint32_t n = 0; n <= 7; ++n) {
    uint8_t left = static_cast<uint8_t>(n);
    int timeouts = 0;
    while (after_ack_timeout(left) == RetryVerdict::kRetry) ASSERT_LE(++timeouts, 8);
    EXPECT_EQ(timeouts, static_cast<int>(n)) << "retry_cnt " << n;
  }
}

}  // namespace
}  // namespace softhca::transport
