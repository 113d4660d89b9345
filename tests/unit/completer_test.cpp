// The pure completer (transport/completer.hpp) on a virtual clock: what each
// answer makes of a WQE, and when its retry budgets run out.
#include "transport/completer.hpp"

#include <gtest/gtest.h>

#include "transport/ibta_timers.hpp"

namespace softhca::transport {
namespace {

TEST(Completer, AckCompletesAndNaksGiveTheirStatus) {
  RetryState s = RetryState::start(7, 7);
  EXPECT_EQ(on_answer(Syndrome::ack(), s, 7, 14, 0), Verdict::complete(IBV_WC_SUCCESS));
  EXPECT_EQ(on_answer(Syndrome::nak(Answer::kNakInvalidRequest), s, 7, 14, 0),
            Verdict::complete(IBV_WC_REM_INV_REQ_ERR));
  EXPECT_EQ(on_answer(Syndrome::nak(Answer::kNakRemoteAccess), s, 7, 14, 0), Verdict::complete(IBV_WC_REM_ACCESS_ERR));
  EXPECT_EQ(on_answer(Syndrome::nak(Answer::kNakRemoteOperational), s, 7, 14, 0),
            Verdict::complete(IBV_WC_REM_OP_ERR));
}

TEST(Completer, RnrWaitsTheRespondersTimerRnrRetryTimesThenGivesUp) {
  const uint8_t rnr_retry = 2;
  RetryState s = RetryState::start(rnr_retry, 7);
  uint64_t now = 1000;
  for (int i = 0; i < rnr_retry; ++i) {
    const Verdict v = on_answer(Syndrome::rnr(12), s, rnr_retry, 14, now);
    ASSERT_EQ(v, Verdict::retry_at(now + rnr_timer_ns(12))) << "retry " << i;
    now = v.retry_at_ns;
  }
  EXPECT_EQ(on_answer(Syndrome::rnr(12), s, rnr_retry, 14, now), Verdict::complete(IBV_WC_RNR_RETRY_EXC_ERR));
}

TEST(Completer, RnrRetrySevenRetriesForEver) {
  RetryState s = RetryState::start(7, 0);
  for (int i = 0; i < 10'000; ++i)
    ASSERT_EQ(on_answer(Syndrome::rnr(1), s, 7, 14, i).kind, Verdict::Kind::kRetryAt);
}

TEST(Completer, SilenceRetransmitsRetryCntTimesAfterTheAckTimeout) {
  const uint8_t timeout = 14, retry_cnt = 3;
  const uint64_t wait = ack_timeout_ns(timeout);
  RetryState s = RetryState::start(7, retry_cnt);
  uint64_t now = 5;
  // The first attempt starts the timer; each later silent attempt spends one retry.
  for (int attempt = 0; attempt <= retry_cnt; ++attempt) {
    const Verdict v = on_answer(Syndrome::silence(), s, 7, timeout, now);
    ASSERT_EQ(v, Verdict::retry_at(now + wait)) << "attempt " << attempt;
    now = v.retry_at_ns;
  }
  EXPECT_EQ(now, 5 + (retry_cnt + 1) * wait);
  EXPECT_EQ(on_answer(Syndrome::silence(), s, 7, timeout, now), Verdict::complete(IBV_WC_RETRY_EXC_ERR));
}

TEST(Completer, TimeoutZeroWaitsForEver) {
  RetryState s = RetryState::start(7, 0);
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(on_answer(Syndrome::silence(), s, 7, 0, i), Verdict::retry_at(i + kInfiniteTimeoutPollNs));
}

TEST(Completer, ASequenceErrorResendsAtOnceAndSpendsARetry) {
  RetryState s = RetryState::start(7, 1);
  EXPECT_EQ(on_answer(Syndrome::nak(Answer::kNakSequenceError), s, 7, 14, 42), Verdict::retry_at(42));
  EXPECT_EQ(s.retry_left, 0);
  EXPECT_EQ(on_answer(Syndrome::nak(Answer::kNakSequenceError), s, 7, 14, 43),
            Verdict::complete(IBV_WC_RETRY_EXC_ERR));
}

}  // namespace
}  // namespace softhca::transport
