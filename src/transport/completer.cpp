#include "transport/completer.hpp"

#include "transport/ibta_timers.hpp"
#include "transport/retry_policy.hpp"

namespace softhca::transport {

ibv_wc_status status_of_nak(Answer nak) {
  switch (nak) {
    case Answer::kNakInvalidRequest:
      return IBV_WC_REM_INV_REQ_ERR;
    case Answer::kNakRemoteAccess:
      return IBV_WC_REM_ACCESS_ERR;
    case Answer::kNakRemoteOperational:
      return IBV_WC_REM_OP_ERR;
    default:
      return IBV_WC_GENERAL_ERR;
  }
}

Verdict on_answer(const Syndrome& syndrome, RetryState& retry, uint8_t rnr_retry, uint8_t timeout, uint64_t now_ns) {
  switch (syndrome.answer) {
    case Answer::kAck:
      return Verdict::complete(IBV_WC_SUCCESS);
    case Answer::kNakInvalidRequest:
    case Answer::kNakRemoteAccess:
    case Answer::kNakRemoteOperational:
      return Verdict::complete(status_of_nak(syndrome.answer));
    case Answer::kNakSequenceError:
      // The responder saw a gap: send again from the NAK'd message at once
      // (go-back-N), spending a retry as a timeout does (rxe's completer
      // too), so that NAKs that never let it through end in RETRY_EXC_ERR.
      if (after_ack_timeout(retry.retry_left) == RetryVerdict::kGiveUp) return Verdict::complete(IBV_WC_RETRY_EXC_ERR);
      retry.deadline_ns = now_ns;
      return Verdict::retry_at(now_ns);
    case Answer::kRnrNak:
      if (after_rnr_nak(rnr_retry, retry.rnr_left) == RetryVerdict::kGiveUp)
        return Verdict::complete(IBV_WC_RNR_RETRY_EXC_ERR);
      retry.deadline_ns = now_ns + rnr_timer_ns(syndrome.rnr_timer);
      return Verdict::retry_at(retry.deadline_ns);
    case Answer::kSilence: {
      // The first attempt starts the ACK timer; each expiry after it spends
      // one retry, and the one after the last gives up.
      const uint64_t wait = ack_timeout_ns(timeout);
      if (wait != 0 && retry.deadline_ns != 0 && after_ack_timeout(retry.retry_left) == RetryVerdict::kGiveUp)
        return Verdict::complete(IBV_WC_RETRY_EXC_ERR);
      retry.deadline_ns = now_ns + (wait != 0 ? wait : kInfiniteTimeoutPollNs);
      return Verdict::retry_at(retry.deadline_ns);
    }
  }
  return Verdict::complete(IBV_WC_GENERAL_ERR);
}

}  // namespace softhca::transport
