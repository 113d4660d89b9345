// The requester's retry budget (IBTA 9.7.5.2.8 RNR, 9.7.6.1.3 transport
// retry), kept pure so that it is tested by count: how many times a WQE is
// sent again before it completes in RNR_RETRY_EXC_ERR or RETRY_EXC_ERR.
#pragma once

#include <cstdint>

namespace softhca::transport {

enum class RetryVerdict { kRetry, kGiveUp };

// rnr_retry is 3 bits; 7 means retry for ever.
inline constexpr uint32_t kRnrRetryForever = 7;

// The responder answered with an RNR NAK. `rnr_left` starts at the QP's
// rnr_retry: the WQE is sent again rnr_retry times, and the NAK after the
// last of them gives up.
inline RetryVerdict after_rnr_nak(uint32_t rnr_retry, uint8_t& rnr_left) {
  if (rnr_retry == kRnrRetryForever) return RetryVerdict::kRetry;
  if (rnr_left == 0) return RetryVerdict::kGiveUp;
  --rnr_left;
  return RetryVerdict::kRetry;
}

// The local ACK timeout expired with no answer. `retry_left` starts at the
// QP's retry_cnt: retry_cnt retransmissions, then RETRY_EXC_ERR.
inline RetryVerdict after_ack_timeout(uint8_t& retry_left) {
  if (retry_left == 0) return RetryVerdict::kGiveUp;
  --retry_left;
  return RetryVerdict::kRetry;
}

}  // namespace softhca::transport
