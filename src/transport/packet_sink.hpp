// Where the packet-level transport's packets go. The flows (requester_flow,
// responder_flow) decide what to send; the udp link encodes and sends it, and
// tests collect it.
#pragma once

#include <sys/uio.h>

#include <cstdint>

#include "wire/packet.hpp"

namespace softhca::transport {

class PacketSink {
 public:
  // One packet: `headers`, and `length` bytes of payload gathered from `payload`.
  virtual void send(const wire::Headers& headers, const iovec* payload, int npayload, uint32_t length) = 0;

 protected:
  ~PacketSink() = default;
};

// The BTH opcode of one packet of a SEND or WRITE message (RC or UC).
uint8_t request_opcode(bool unreliable, bool is_send, bool with_imm, wire::Segment segment);

// The segment of packet `index` of a message of `count` packets.
constexpr wire::Segment segment_of(uint32_t index, uint32_t count) {
  if (count == 1) return wire::Segment::kOnly;
  if (index == 0) return wire::Segment::kFirst;
  return index + 1 == count ? wire::Segment::kLast : wire::Segment::kMiddle;
}

}  // namespace softhca::transport
