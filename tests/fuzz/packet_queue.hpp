// One direction of transport_flows_fuzz.cpp's wire: a PacketSink that
// encodes what a flow sends into RoCEv2 bytes, queues them, and hands them
// to the other flow through wire::parse, as the udp link's handle() does
// (the IP/UDP header image built from the flow's addresses). The script
// decides per delivered packet whether it is lost, duplicated, overtaken or
// corrupted; a corrupted one reaches the flows only if it still parses.
#pragma once

#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#include "checked_port.hpp"
#include "transport/packet_sink.hpp"
#include "transport_script.hpp"
#include "wire/ip_udp.hpp"
#include "wire/packet.hpp"

namespace softhca::fuzz {

struct Encoded {
  std::vector<uint8_t> image;  // the IP and UDP headers the ICRC covers
  std::vector<uint8_t> bytes;  // the UDP payload: BTH to ICRC
};

inline const wire::UdpFlow& fuzz_flow() {
  static const wire::UdpFlow flow{wire::Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1},
                                  wire::Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2}};
  return flow;
}

// What the flows send must encode: they build the headers themselves.
inline Encoded encode_packet(const wire::Headers& h, std::span<const uint8_t> payload) {
  const auto info = wire::opcode_info(h.bth.opcode);
  if (!info) broken("a flow sends only known opcodes");
  const std::size_t size = wire::encoded_size(*info, payload.size());
  Encoded e;
  e.image.resize(wire::kIpv6HeaderSize + wire::kUdpHeaderSize);
  const auto n = wire::write_ip_udp_headers(fuzz_flow(), size, e.image);
  if (!n) broken("a flow's packet fits a datagram");
  e.image.resize(*n);
  e.bytes.resize(size);
  if (!wire::encode(h, payload, e.image, e.bytes)) broken("a flow's headers encode");
  return e;
}

class PacketQueue final : public transport::PacketSink {
 public:
  // One call into a flow sends at most a window's worth and a READ's
  // response (or far fewer): more than this, and it is looping.
  static constexpr uint64_t kMaxPacketsPerCall = 1024;
  static constexpr std::size_t kMaxQueued = 4096;  // beyond: dropped, as a full socket buffer would

  // Called with each packet sent, before it is queued.
  std::function<void(const wire::Headers&, uint32_t length)> on_send;

  void send(const wire::Headers& h, const iovec* payload, int npayload, uint32_t length) override {
    if (++sent_in_call_ > kMaxPacketsPerCall) broken("one call into a flow sends a bounded number of packets");
    std::vector<uint8_t> data(length);
    uint32_t at = 0;
    for (int i = 0; i < npayload; ++i) {
      if (at + payload[i].iov_len > length) broken("a packet's payload pieces add up to its length");
      std::memcpy(data.data() + at, payload[i].iov_base, payload[i].iov_len);
      at += static_cast<uint32_t>(payload[i].iov_len);
    }
    if (at != length) broken("a packet's payload pieces add up to its length");
    if (on_send) on_send(h, length);
    if (queue_.size() < kMaxQueued) queue_.push_back(encode_packet(h, data));
  }

  void push(Encoded e) {
    if (queue_.size() < kMaxQueued) queue_.push_back(std::move(e));
  }
  bool empty() const { return queue_.empty(); }
  // The harness calls this before each call into the flow that sends here.
  void new_call() { sent_in_call_ = 0; }
  void clear() { queue_.clear(); }

  // Takes the next packet and applies `fault` (script::Fault); `to` gets it
  // if it (still) parses. `corrupt_at` and `corrupt_xor` say which byte.
  void deliver(uint8_t fault, uint16_t corrupt_at, uint8_t corrupt_xor,
               const std::function<void(const wire::ParsedPacket&)>& to) {
    if (queue_.empty()) return;
    Encoded e = std::move(queue_.front());
    queue_.pop_front();
    switch (fault % 8) {
      case script::kLost:
        return;
      case script::kTwice:
        hand(e, to);
        break;
      case script::kLate:
        queue_.push_back(std::move(e));
        return;
      case script::kCorrupt:
        e.bytes[corrupt_at % e.bytes.size()] ^= corrupt_xor == 0 ? 1 : corrupt_xor;
        if (fault & 0x80) seal(e);
        break;
      default:
        break;
    }
    hand(e, to);
  }

  // Stores a valid ICRC, so that a changed packet gets past the check.
  static void seal(Encoded& e) {
    if (e.bytes.size() < wire::kIcrcSize) return;
    if (const auto icrc = wire::icrc_of(e.image, e.bytes))
      wire::store_icrc(*icrc, std::span(e.bytes).last<wire::kIcrcSize>());
  }

  static void hand(const Encoded& e, const std::function<void(const wire::ParsedPacket&)>& to) {
    const auto parsed = wire::parse(e.image, e.bytes);
    if (parsed) to(*parsed);
  }

 private:
  std::deque<Encoded> queue_;
  uint64_t sent_in_call_ = 0;
};

}  // namespace softhca::fuzz
