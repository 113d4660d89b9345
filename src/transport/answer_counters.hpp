// Which counter an answer bumps, at the responder that sends it and at the
// requester that receives it: one mapping for both links (the shm link hands
// syndromes over directly, the udp link carries them in AETHs).
#pragma once

#include "common/counters.hpp"
#include "transport/syndrome.hpp"

namespace softhca::transport {

inline void count_sent_answer(const CounterSink& counters, Answer answer) {
  switch (answer) {
    case Answer::kRnrNak: counters.add(Counter::kSendRnrErr); return;
    case Answer::kNakSequenceError: counters.add(Counter::kSentSeqNak); return;
    case Answer::kNakInvalidRequest: counters.add(Counter::kSentNakInvalidRequest); return;
    case Answer::kNakRemoteAccess: counters.add(Counter::kSentNakRemoteAccess); return;
    case Answer::kNakRemoteOperational: counters.add(Counter::kSentNakRemoteOperation); return;
    case Answer::kAck:
    case Answer::kSilence: return;
  }
}

inline void count_received_answer(const CounterSink& counters, Answer answer) {
  switch (answer) {
    case Answer::kRnrNak: counters.add(Counter::kRcvdRnrErr); return;
    case Answer::kNakSequenceError: counters.add(Counter::kRcvdSeqErr); return;
    case Answer::kNakInvalidRequest: counters.add(Counter::kRcvdNakInvalidRequest); return;
    case Answer::kNakRemoteAccess: counters.add(Counter::kRcvdNakRemoteAccess); return;
    case Answer::kNakRemoteOperational: counters.add(Counter::kRcvdNakRemoteOperation); return;
    case Answer::kAck:
    case Answer::kSilence: return;
  }
}

}  // namespace softhca::transport
