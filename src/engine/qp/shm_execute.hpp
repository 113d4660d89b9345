// The shm transport's requester: executes one send WQE of a local QP by
// operating directly on the target's shared state — rkey validation against
// the host registry, receive-WQE consumption, the data copy into or out of the
// target's memory, the target's receive completion — with the responder rules
// of the IBTA (access errors, length errors, RNR, silent drops for UC/UD).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "engine/qp/send_wqe.hpp"

namespace softhca::engine {

class Node;
class QueuePair;

struct ExecOutcome {
  enum class Kind {
    kDone,        // finished: `status` is the requester's completion status
    kRnr,         // the responder had no receive WQE: retry after rnr_delay_ns
    kNoResponse,  // nobody answered (no such QP, not ready, process gone): retry on timeout
  };
  Kind kind;
  ibv_wc_status status;
  uint64_t rnr_delay_ns;
};

ExecOutcome shm_execute(QueuePair& qp, SendWqe& wqe);

// The incarnation of the QP that has number `qpn` now, or 0 if there is none.
uint64_t peer_incarnation_of(Node& node, uint32_t qpn);

// IBTA's encoding of min_rnr_timer (5 bits) in nanoseconds.
uint64_t rnr_timer_ns(uint32_t code);
// IBTA's local ACK timeout (5 bits): 4.096 us * 2^code; 0 means infinite.
uint64_t ack_timeout_ns(uint32_t code);

}  // namespace softhca::engine
