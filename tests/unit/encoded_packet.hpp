// What a PacketSink is handed, encoded as it would travel: the IP and UDP
// header image of `flow` (which the ICRC covers) and the RoCE packet's
// bytes. For the tests that carry packets between transport flows.
#pragma once

#include <gtest/gtest.h>
#include <sys/uio.h>

#include <cstring>
#include <optional>
#include <vector>

#include "wire/ip_udp.hpp"
#include "wire/packet.hpp"

namespace softhca::test_support {

struct EncodedPacket {
  std::vector<uint8_t> image;  // IP + UDP headers
  std::vector<uint8_t> bytes;  // BTH ... ICRC
};

// Nothing (and a test failure) when the headers cannot be encoded.
inline std::optional<EncodedPacket> encode_packet(const wire::UdpFlow& flow, const wire::Headers& h,
                                                  const iovec* payload, int npayload, uint32_t length) {
  std::vector<uint8_t> data(length);
  uint32_t at = 0;
  for (int i = 0; i < npayload; ++i) {
    std::memcpy(data.data() + at, payload[i].iov_base, payload[i].iov_len);
    at += static_cast<uint32_t>(payload[i].iov_len);
  }
  const auto info = wire::opcode_info(h.bth.opcode);
  EXPECT_TRUE(info.has_value());
  if (!info) return std::nullopt;
  const size_t size = wire::encoded_size(*info, length);
  EncodedPacket p{std::vector<uint8_t>(48), std::vector<uint8_t>(size)};
  const auto n = wire::write_ip_udp_headers(flow, size, p.image);
  EXPECT_TRUE(n.has_value());
  if (!n) return std::nullopt;
  p.image.resize(*n);
  const bool encoded = wire::encode(h, data, p.image, p.bytes).has_value();
  EXPECT_TRUE(encoded);
  if (!encoded) return std::nullopt;
  return p;
}

}  // namespace softhca::test_support
