// The two timers of the IBTA reliable transport, as the QP attributes encode
// them: the RNR NAK timer a responder asks for (min_rnr_timer, 5 bits) and the
// requester's local ACK timeout (timeout, 5 bits).
#pragma once

#include <cstdint>

namespace softhca::transport {

// IBTA's encoding of min_rnr_timer (5 bits) in nanoseconds.
uint64_t rnr_timer_ns(uint32_t code);
// IBTA's local ACK timeout (5 bits): 4.096 us * 2^code; 0 means infinite.
uint64_t ack_timeout_ns(uint32_t code);

}  // namespace softhca::transport
