// The IBTA responder, pure: given one request and a port onto the QP that
// receives it, it runs the checks in order — the operation, the QP's
// resources, the receive WQE, the length, the key — executes the operation
// through the port, and returns the syndrome an RC responder would send
// (ACK, RNR NAK, NAK invalid request / remote access / remote operational,
// or silence). UC gets the same checks and drops the message where RC would
// NAK (the syndrome is then silence). No rule is written anywhere else: the
// shm and udp links both call it.
#pragma once

#include <cstdint>
#include <span>

#include "transport/request.hpp"
#include "transport/responder_port.hpp"
#include "transport/syndrome.hpp"

namespace softhca::transport {

struct Response {
  Syndrome syndrome;
  uint64_t atomic_original = 0;  // CAS and FAA: the value the atomic replaced (goes back in the ACK)
};

// RC and UC: `request` to the QP behind `port`; `reliable` is true for RC.
Response respond(const Request& request, ResponderPort& port, bool reliable);

// UD: a SEND to the QP behind `port`, `grh` (40 bytes) placed before the
// payload in the receive buffer. A datagram that cannot be received is
// dropped silently, as UD allows.
void respond_datagram(const Request& request, std::span<const unsigned char> grh, ResponderPort& port);

// True for the states in which a QP accepts incoming messages (RTR and later, but not ERROR).
bool receives_in_state(uint32_t state);

}  // namespace softhca::transport
