// What a responder answers a request with, in IBTA terms (9.7.5.2: the AETH
// syndrome of an RC responder): an ACK, an RNR NAK carrying the responder's
// min_rnr_timer, a NAK with its code, or nothing at all (a responder that is
// not there or drops the request). The shm link hands it to the completer
// directly; the udp link carries it in an AETH.
#pragma once

#include <cstdint>

namespace softhca::transport {

enum class Answer : uint8_t {
  kAck,
  kRnrNak,                // receiver not ready: no receive WQE
  kNakSequenceError,      // NAK code 0: a PSN gap (udp link only)
  kNakInvalidRequest,     // NAK code 1: bad opcode, length, alignment, no RDMA resources
  kNakRemoteAccess,       // NAK code 2: rkey, range, PD or access flags
  kNakRemoteOperational,  // NAK code 3: the responder failed to complete it (bad receive WQE)
  kSilence,               // no answer: the requester's ACK timer will fire
};

struct Syndrome {
  Answer answer = Answer::kSilence;
  uint8_t rnr_timer = 0;  // kRnrNak: the responder's min_rnr_timer code (5 bits)

  static constexpr Syndrome ack() { return {Answer::kAck, 0}; }
  static constexpr Syndrome silence() { return {Answer::kSilence, 0}; }
  static constexpr Syndrome rnr(uint8_t timer_code) { return {Answer::kRnrNak, static_cast<uint8_t>(timer_code & 31)}; }
  static constexpr Syndrome nak(Answer code) { return {code, 0}; }
  bool operator==(const Syndrome&) const = default;
};

const char* answer_name(Answer answer);

}  // namespace softhca::transport
