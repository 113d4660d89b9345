// The IBTA completer, pure: what the requester does with the answer to one
// of its messages. An ACK completes it; a NAK completes it with the matching
// REM_* status; an RNR NAK or no answer at all sends it again after the
// responder's RNR timer or the QP's ACK timeout, until rnr_retry or retry_cnt
// is spent. Time comes in as `now_ns`: the completer never reads a clock.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "transport/syndrome.hpp"

namespace softhca::transport {

// The retry state one send WQE carries from its first attempt to its completion.
struct RetryState {
  uint64_t deadline_ns = 0;  // when the WQE is tried again; 0 before its first wait
  uint8_t rnr_left = 0;      // starts at the QP's rnr_retry
  uint8_t retry_left = 0;    // starts at the QP's retry_cnt

  static RetryState start(uint8_t rnr_retry, uint8_t retry_cnt) { return RetryState{0, rnr_retry, retry_cnt}; }
};

struct Verdict {
  enum class Kind { kComplete, kRetryAt };
  Kind kind = Kind::kComplete;
  ibv_wc_status status = IBV_WC_SUCCESS;  // kComplete
  uint64_t retry_at_ns = 0;               // kRetryAt

  static Verdict complete(ibv_wc_status status) { return {Kind::kComplete, status, 0}; }
  static Verdict retry_at(uint64_t when) { return {Kind::kRetryAt, IBV_WC_SUCCESS, when}; }
  bool operator==(const Verdict&) const = default;
};

// While timeout 0 ("wait for ever") waits, the requester still looks again this often.
inline constexpr uint64_t kInfiniteTimeoutPollNs = 10'000'000;

// A reliable (RC) requester got `syndrome` for the WQE whose state is
// `retry`; `rnr_retry` and `timeout` are the QP's attributes.
Verdict on_answer(const Syndrome& syndrome, RetryState& retry, uint8_t rnr_retry, uint8_t timeout, uint64_t now_ns);

// The requester status a NAK stands for (IBTA 9.7.5.2.4 / the verbs manual's
// ibv_wc_status list): REM_INV_REQ_ERR, REM_ACCESS_ERR, REM_OP_ERR.
ibv_wc_status status_of_nak(Answer nak);

}  // namespace softhca::transport
