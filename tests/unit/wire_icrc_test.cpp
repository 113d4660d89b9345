// The ICRC and the IP/UDP header image it covers, against the scapy-built
// golden packets (tests/unit/wire_golden/make_golden.py).
#include "wire/icrc.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "wire/ip_udp.hpp"
#include "wire_golden/golden_support.hpp"

namespace softhca::wire {
namespace {

using golden::kPackets;

class WireIcrcGolden : public testing::TestWithParam<std::size_t> {
 protected:
  const golden::Packet& packet() const { return kPackets[GetParam()]; }
  std::vector<uint8_t> copy() const { return {packet().ip_packet.begin(), packet().ip_packet.end()}; }
};

TEST_P(WireIcrcGolden, MatchesTheGoldenIcrc) {
  const auto& p = packet();
  const auto whole = icrc_of(p.ip_packet);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(*whole, p.icrc);
  const auto split = icrc_of(golden::ip_udp_headers_of(p), golden::udp_payload_of(p));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(*split, p.icrc);
  // On the wire least significant byte first, as rxe and scapy store it.
  EXPECT_EQ(load_icrc(p.ip_packet.last<kIcrcSize>()), p.icrc);
}

TEST_P(WireIcrcGolden, IgnoresTheFieldsRoutersAndSwitchesChange) {
  const auto& p = packet();
  const std::size_t udp = p.flow.ipv6 ? kIpv6HeaderSize : kIpv4HeaderSize;
  std::vector<std::size_t> variant;  // byte offsets of masked fields (whole bytes)
  if (p.flow.ipv6) {
    variant = {1, 2, 3, 7};  // traffic class low nibble and flow label, hop limit
  } else {
    variant = {1, 8, 10, 11};  // TOS, TTL, header checksum
  }
  variant.push_back(udp + 6);  // UDP checksum
  variant.push_back(udp + 7);
  variant.push_back(udp + kUdpHeaderSize + 4);  // BTH: FECN, BECN, reserved
  for (std::size_t offset : variant) {
    for (int value : {0x00, 0x5A, 0xFF}) {
      auto bytes = copy();
      bytes[offset] = static_cast<uint8_t>(value);
      const auto icrc = icrc_of(bytes);
      ASSERT_TRUE(icrc.has_value()) << offset;
      EXPECT_EQ(*icrc, p.icrc) << "offset " << offset << " value " << value;
    }
  }
  if (p.flow.ipv6) {
    // The traffic class's high nibble shares byte 0 with the version.
    auto bytes = copy();
    bytes[0] = 0x6F;
    EXPECT_EQ(icrc_of(bytes).value(), p.icrc);
  }
}

TEST_P(WireIcrcGolden, CoversEveryOtherByteAfterTheUdpHeader) {
  const auto& p = packet();
  const std::size_t bth = golden::udp_payload_offset(p);
  for (std::size_t i = bth; i + kIcrcSize < p.ip_packet.size(); ++i) {
    if (i == bth + 4) continue;  // the masked BTH byte
    auto bytes = copy();
    bytes[i] ^= 0x01;
    EXPECT_NE(icrc_of(bytes).value(), p.icrc) << "byte " << i;
  }
}

TEST_P(WireIcrcGolden, HeaderImageMatchesScapyIncludingChecksums) {
  const auto& p = packet();
  const UdpFlow flow = golden::to_flow(p.flow);
  const std::size_t udp_payload = golden::udp_payload_of(p).size();
  std::vector<uint8_t> image(golden::udp_payload_offset(p));
  const auto written = write_ip_udp_headers(flow, udp_payload, image);
  ASSERT_TRUE(written.has_value());
  ASSERT_EQ(*written, image.size());
  // The UDP checksum is written as 0 until the payload is there.
  std::vector<uint8_t> expected(p.ip_packet.begin(), p.ip_packet.begin() + static_cast<std::ptrdiff_t>(image.size()));
  const std::size_t checksum = image.size() - 2;
  expected[checksum] = expected[checksum + 1] = 0;
  EXPECT_EQ(image, expected);
  EXPECT_EQ(check_ip_udp_headers(image, udp_payload).value(), p.flow.ipv6 ? IpVersion::kV6 : IpVersion::kV4);

  auto bytes = copy();
  bytes[checksum] = bytes[checksum + 1] = 0;
  ASSERT_TRUE(fill_udp_checksum(bytes).has_value());
  EXPECT_EQ(bytes[checksum], p.ip_packet[checksum]);
  EXPECT_EQ(bytes[checksum + 1], p.ip_packet[checksum + 1]);
}

INSTANTIATE_TEST_SUITE_P(Golden, WireIcrcGolden, testing::ValuesIn(golden::all_packet_indices()),
                         golden::packet_name);

TEST(WireIcrc, StoredLeastSignificantByteFirst) {
  std::array<uint8_t, 4> out{};
  store_icrc(0x11223344, out);
  EXPECT_EQ(out, (std::array<uint8_t, 4>{0x44, 0x33, 0x22, 0x11}));
  EXPECT_EQ(load_icrc(out), 0x11223344u);
}

TEST(WireIcrc, RefusesWhatItCannotCover) {
  const auto& p = kPackets[0];
  const auto headers = golden::ip_udp_headers_of(p);
  const auto payload = golden::udp_payload_of(p);
  // Shorter than a BTH and an ICRC.
  EXPECT_FALSE(icrc_of(headers, payload.first(kBthSize + kIcrcSize - 1)).has_value());
  // Headers whose lengths describe another payload.
  EXPECT_FALSE(icrc_of(headers, payload.first(payload.size() - 4)).has_value());
  EXPECT_FALSE(icrc_of(p.ip_packet.first(20)).has_value());
  EXPECT_FALSE(icrc_of(std::span<const uint8_t>()).has_value());
}

TEST(WireIpUdp, VersionFollowsTheGids) {
  UdpFlow flow;
  flow.src_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1};
  flow.dst_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2};
  EXPECT_EQ(ip_version_of(flow).value(), IpVersion::kV4);
  EXPECT_EQ(ip_udp_header_size(flow).value(), 28u);
  flow.dst_gid = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  EXPECT_EQ(ip_version_of(flow).error(), std::errc::invalid_argument);
  flow.src_gid = flow.dst_gid;
  EXPECT_EQ(ip_version_of(flow).value(), IpVersion::kV6);
  EXPECT_EQ(ip_udp_header_size(flow).value(), 48u);
}

TEST(WireIpUdp, WriteRefusesSmallBuffersAndHugeDatagrams) {
  const UdpFlow flow = golden::to_flow(kPackets[0].flow);
  std::array<uint8_t, 27> small{};
  EXPECT_EQ(write_ip_udp_headers(flow, 16, small).error(), std::errc::no_buffer_space);
  std::array<uint8_t, 28> fits{};
  EXPECT_TRUE(write_ip_udp_headers(flow, 65535 - 28, fits).has_value());
  EXPECT_EQ(write_ip_udp_headers(flow, 65535 - 27, fits).error(), std::errc::invalid_argument);
}

// One IPv4 packet of the golden set, with a header byte changed, is refused
// by check_ip_udp_headers and split_ip_udp alike.
TEST(WireIpUdp, RefusesHeadersOfUnsupportedForm) {
  const auto& p = kPackets[0];
  ASSERT_FALSE(p.flow.ipv6);
  const std::size_t payload = golden::udp_payload_of(p).size();
  auto changed = [&](std::size_t offset, uint8_t value) {
    std::vector<uint8_t> b(p.ip_packet.begin(), p.ip_packet.end());
    b[offset] = value;
    return b;
  };
  const std::pair<std::size_t, uint8_t> cases[] = {
      {0, 0x46},  // IPv4 with options
      {0, 0x55},  // version 5
      {6, 0x60},  // DF and MF: a fragment
      {7, 0x01},  // fragment offset
      {9, 6},     // TCP
      {3, static_cast<uint8_t>(p.ip_packet[3] + 4)},    // IP total length
      {25, static_cast<uint8_t>(p.ip_packet[25] + 4)},  // UDP length
  };
  for (const auto& [offset, value] : cases) {
    const auto b = changed(offset, value);
    EXPECT_FALSE(check_ip_udp_headers(std::span(b).first(28), payload).has_value()) << offset;
    EXPECT_FALSE(split_ip_udp(b).has_value()) << offset;
  }
  EXPECT_FALSE(check_ip_udp_headers(p.ip_packet.first(27), payload).has_value());
}

TEST(WireIpUdp, SplitIgnoresLinkPaddingAfterTheDatagram) {
  const auto& p = kPackets[0];
  std::vector<uint8_t> padded(p.ip_packet.begin(), p.ip_packet.end());
  padded.resize(padded.size() + 6, 0);
  const auto view = split_ip_udp(padded);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->udp_payload.size(), golden::udp_payload_of(p).size());
  EXPECT_EQ(view->dst_port, kRoceV2Port);
  EXPECT_EQ(view->src_port, p.flow.src_port);
  EXPECT_EQ(icrc_of(padded).value(), p.icrc);
}

TEST(WireIpUdp, UdpChecksumIsNeverZero) {
  // Zero means "no checksum" (and is illegal over IPv6), so a sum that comes
  // out zero is sent as 0xFFFF. Walk one 16-bit word through every value so
  // that the sum hits that case.
  for (const char* name : {"rc_send_only", "rc_send_only_v6"}) {
    const golden::Packet* p = nullptr;
    for (const auto& q : kPackets) {
      if (q.name == name) p = &q;
    }
    ASSERT_NE(p, nullptr);
    std::vector<uint8_t> b(p->ip_packet.begin(), p->ip_packet.end());
    const std::size_t word = golden::udp_payload_offset(*p) + kBthSize;
    const std::size_t checksum = golden::udp_payload_offset(*p) - 2;
    int all_ones = 0;
    for (uint32_t w = 0; w <= 0xFFFF; ++w) {
      b[word] = static_cast<uint8_t>(w >> 8);
      b[word + 1] = static_cast<uint8_t>(w);
      ASSERT_TRUE(fill_udp_checksum(b).has_value());
      const uint16_t sum = static_cast<uint16_t>(b[checksum] << 8 | b[checksum + 1]);
      ASSERT_NE(sum, 0) << name << " word " << w;
      all_ones += sum == 0xFFFF;
    }
    EXPECT_GT(all_ones, 0) << name;
  }
}

TEST(WireIpUdp, RefusesIpv6WithExtensionHeaders) {
  for (const auto& p : kPackets) {
    if (!p.flow.ipv6) continue;
    std::vector<uint8_t> b(p.ip_packet.begin(), p.ip_packet.end());
    b[6] = 0;  // hop-by-hop options instead of UDP
    EXPECT_FALSE(split_ip_udp(b).has_value());
    return;
  }
  FAIL() << "no IPv6 golden packet";
}

}  // namespace
}  // namespace softhca::wire
