// Whole-packet encode and parse against the scapy-built golden packets
// (tests/unit/wire_golden/make_golden.py), and every way a received packet
// can be malformed.
#include "wire/packet.hpp"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "wire/icrc.hpp"
#include "wire_golden/golden_support.hpp"

namespace softhca::wire {
namespace {

using golden::kPackets;
using Bytes = std::vector<uint8_t>;

Bytes to_bytes(std::span<const uint8_t> s) { return Bytes(s.begin(), s.end()); }

// A UDP payload with its own header image, as the link will hold them.
struct Datagram {
  UdpFlow flow;
  Bytes headers;
  Bytes payload;
};

// Rebuilds the header image for the payload's current length and writes a
// valid ICRC: a malformed packet that arrived intact, so that the parser's
// structural checks are reached rather than its ICRC check.
void reseal(Datagram& d) {
  d.headers.assign(ip_udp_header_size(d.flow).value(), 0);
  ASSERT_TRUE(write_ip_udp_headers(d.flow, d.payload.size(), d.headers).has_value());
  if (d.payload.size() < kBthSize + kIcrcSize) return;
  store_icrc(icrc_of(d.headers, d.payload).value(), std::span(d.payload).last<kIcrcSize>());
}

Datagram datagram_of(const golden::Packet& p) {
  return Datagram{.flow = golden::to_flow(p.flow),
                  .headers = to_bytes(golden::ip_udp_headers_of(p)),
                  .payload = to_bytes(golden::udp_payload_of(p))};
}

std::expected<ParsedPacket, ParseError> parse(const Datagram& d, const ParseLimits& limits = {}) {
  return wire::parse(d.headers, d.payload, limits);
}

class WirePacketGolden : public testing::TestWithParam<std::size_t> {
 protected:
  const golden::Packet& packet() const { return kPackets[GetParam()]; }
};

TEST_P(WirePacketGolden, EncodeIpPacketEqualsScapysBytes) {
  const auto& p = packet();
  Bytes out(p.ip_packet.size() + 64, 0xEE);
  const auto n = encode_ip_packet(golden::to_flow(p.flow), golden::to_headers(p.fields), p.payload, out);
  ASSERT_TRUE(n.has_value());
  out.resize(*n);
  EXPECT_EQ(out, to_bytes(p.ip_packet));
}

TEST_P(WirePacketGolden, EncodeUdpPayloadEqualsScapysBytes) {
  const auto& p = packet();
  const auto info = opcode_info(p.fields.opcode);
  ASSERT_TRUE(info.has_value());
  const Bytes expected = to_bytes(golden::udp_payload_of(p));
  ASSERT_EQ(encoded_size(*info, p.payload.size()), expected.size());
  Bytes out(expected.size());
  const auto n = encode(golden::to_headers(p.fields), p.payload, golden::ip_udp_headers_of(p), out);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, expected.size());
  EXPECT_EQ(out, expected);
}

TEST_P(WirePacketGolden, EncodeAroundAPayloadInPlaceEqualsScapysBytes) {
  // The udp link gathers a WQE's payload into the packet itself and has
  // only the headers, pad and ICRC written around it. Stale bytes where
  // those go must not show.
  const auto& p = packet();
  const auto info = opcode_info(p.fields.opcode);
  ASSERT_TRUE(info.has_value());
  const Bytes expected = to_bytes(golden::udp_payload_of(p));
  Bytes out(expected.size() + 16, uint8_t{0xA5});
  std::copy(p.payload.begin(), p.payload.end(), out.begin() + static_cast<std::ptrdiff_t>(info->header_size));
  const auto n = encode_around_payload(golden::to_headers(p.fields), p.payload.size(), golden::ip_udp_headers_of(p),
                                       out);
  ASSERT_TRUE(n.has_value());
  ASSERT_EQ(*n, expected.size());
  out.resize(*n);
  EXPECT_EQ(out, expected);
}

TEST_P(WirePacketGolden, ParseGivesTheFieldsItWasBuiltFrom) {
  const auto& p = packet();
  const auto parsed = parse_ip_packet(p.ip_packet);
  ASSERT_TRUE(parsed.has_value()) << to_string(parsed.error());
  EXPECT_EQ(parsed->headers, golden::to_headers(p.fields));
  EXPECT_EQ(static_cast<uint8_t>(parsed->info.opcode), p.fields.opcode);
  EXPECT_EQ(to_bytes(parsed->payload), to_bytes(p.payload));
  // The payload is a view into the packet, right after the headers.
  EXPECT_EQ(parsed->payload.data(), golden::udp_payload_of(p).data() + parsed->info.header_size);

  const auto split = wire::parse(golden::ip_udp_headers_of(p), golden::udp_payload_of(p));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->headers, parsed->headers);
}

TEST_P(WirePacketGolden, ParseThenEncodeGivesTheSameBytes) {
  const auto& p = packet();
  const auto parsed = parse_ip_packet(p.ip_packet);
  ASSERT_TRUE(parsed.has_value());
  Bytes out(p.ip_packet.size());
  const auto n = encode(parsed->headers, parsed->payload, golden::ip_udp_headers_of(p), out);
  ASSERT_TRUE(n.has_value());
  out.resize(*n);
  EXPECT_EQ(out, to_bytes(golden::udp_payload_of(p)));
}

TEST_P(WirePacketGolden, EveryTruncationIsRejected) {
  const auto& p = packet();
  const Datagram whole = datagram_of(p);
  for (std::size_t len = 0; len < whole.payload.size(); ++len) {
    SCOPED_TRACE(testing::Message() << "length " << len);
    // As received: the link's header image states the short length, and the
    // ICRC no longer matches (or is not even there).
    Datagram d = whole;
    d.payload.resize(len);
    d.headers.assign(ip_udp_header_size(d.flow).value(), 0);
    ASSERT_TRUE(write_ip_udp_headers(d.flow, len, d.headers).has_value());
    const auto r = parse(d);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error(), len < kBthSize + kIcrcSize ? ParseError::kTruncated : ParseError::kBadIcrc);
    // A whole IP packet cut short does not even have a consistent IP header.
    EXPECT_EQ(parse_ip_packet(p.ip_packet.first(golden::udp_payload_offset(p) + len)).error(),
              ParseError::kBadIpUdpHeader);
  }
}

TEST_P(WirePacketGolden, TruncationWithAValidIcrcIsCaughtByLength) {
  const auto& p = packet();
  const auto info = opcode_info(p.fields.opcode).value();
  const Datagram whole = datagram_of(p);
  for (std::size_t len = kBthSize + kIcrcSize; len < whole.payload.size(); ++len) {
    SCOPED_TRACE(testing::Message() << "length " << len);
    Datagram d = whole;
    d.payload.resize(len);
    reseal(d);
    const auto r = parse(d);
    if (len < info.header_size + kIcrcSize) {
      ASSERT_FALSE(r.has_value());
      EXPECT_EQ(r.error(), ParseError::kTruncated);
    } else if (r.has_value()) {
      // Only a data packet cut at a 4-byte boundary is still a packet: a
      // shorter one of the same opcode, whose sizes add up.
      EXPECT_EQ(info.payload, PayloadRule::kData);
      EXPECT_EQ(r->info.header_size + r->payload.size() + r->headers.bth.pad_count + kIcrcSize, len);
    } else {
      EXPECT_NE(r.error(), ParseError::kBadIcrc);
    }
  }
}

TEST_P(WirePacketGolden, EveryFlippedBitIsABadIcrc) {
  const auto& p = packet();
  const Datagram whole = datagram_of(p);
  for (std::size_t byte = 0; byte < whole.payload.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Datagram d = whole;
      d.payload[byte] ^= static_cast<uint8_t>(1U << bit);
      const auto r = parse(d);
      if (byte == 4) {
        // FECN, BECN and reserved bits: switches may set them, the ICRC does
        // not cover them, and the packet stays good.
        ASSERT_TRUE(r.has_value()) << "bit " << bit;
        continue;
      }
      ASSERT_FALSE(r.has_value()) << "byte " << byte << " bit " << bit;
      EXPECT_EQ(r.error(), ParseError::kBadIcrc) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST_P(WirePacketGolden, FlippedHeaderImageBitsAreCaughtUnlessMasked) {
  const auto& p = packet();
  const Datagram whole = datagram_of(p);
  const std::size_t ip = p.flow.ipv6 ? kIpv6HeaderSize : kIpv4HeaderSize;
  auto masked = [&](std::size_t byte, int bit) {
    if (byte == ip + 6 || byte == ip + 7) return true;  // UDP checksum
    if (p.flow.ipv6) return (byte == 0 && bit < 4) || byte == 1 || byte == 2 || byte == 3 || byte == 7;
    return byte == 1 || byte == 8 || byte == 10 || byte == 11;
  };
  for (std::size_t byte = 0; byte < whole.headers.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Datagram d = whole;
      d.headers[byte] ^= static_cast<uint8_t>(1U << bit);
      const auto r = parse(d);
      if (masked(byte, bit)) {
        EXPECT_TRUE(r.has_value()) << "byte " << byte << " bit " << bit;
      } else {
        ASSERT_FALSE(r.has_value()) << "byte " << byte << " bit " << bit;
        EXPECT_TRUE(r.error() == ParseError::kBadIcrc || r.error() == ParseError::kBadIpUdpHeader)
            << "byte " << byte << " bit " << bit << ": " << to_string(r.error());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, WirePacketGolden, testing::ValuesIn(golden::all_packet_indices()),
                         golden::packet_name);

const golden::Packet& golden_named(std::string_view name) {
  for (const auto& p : kPackets) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no golden packet " << name;
  return kPackets[0];
}

TEST(WirePacketMalformed, TransportVersionOtherThanZero) {
  for (uint8_t tver = 1; tver < 16; ++tver) {
    Datagram d = datagram_of(golden_named("rc_send_only"));
    d.payload[1] = static_cast<uint8_t>((d.payload[1] & 0xF0) | tver);
    reseal(d);
    EXPECT_EQ(parse(d).error(), ParseError::kBadTransportVersion) << int{tver};
  }
}

TEST(WirePacketMalformed, EveryUnknownOpcode) {
  int unknown = 0;
  for (int op = 0; op < 256; ++op) {
    if (opcode_info(static_cast<uint8_t>(op))) continue;
    ++unknown;
    Datagram d = datagram_of(golden_named("rc_send_only"));
    d.payload[0] = static_cast<uint8_t>(op);
    reseal(d);
    EXPECT_EQ(parse(d).error(), ParseError::kUnknownOpcode) << op;
  }
  EXPECT_EQ(unknown, 256 - static_cast<int>(all_opcodes().size()));
}

TEST(WirePacketMalformed, PadCountLargerThanWhatFollows) {
  for (const char* name : {"rc_send_only_empty", "rc_ack", "rc_rdma_read_request"}) {
    for (uint8_t pad = 1; pad < 4; ++pad) {
      Datagram d = datagram_of(golden_named(name));
      d.payload[1] = static_cast<uint8_t>(d.payload[1] | (pad << 4));
      reseal(d);
      EXPECT_EQ(parse(d).error(), ParseError::kBadPadCount) << name << " pad " << int{pad};
    }
  }
}

TEST(WirePacketMalformed, LengthNotAMultipleOfFour) {
  for (const char* name : {"rc_send_only", "rc_ack", "ud_send_only_imm_pad"}) {
    for (std::size_t extra = 1; extra < 4; ++extra) {
      Datagram d = datagram_of(golden_named(name));
      d.payload.insert(d.payload.end() - kIcrcSize, extra, 0);
      reseal(d);
      EXPECT_EQ(parse(d).error(), ParseError::kUnalignedLength) << name << " +" << extra;
    }
  }
}

TEST(WirePacketMalformed, PayloadOnOpcodesThatCarryNone) {
  for (const char* name : {"rc_ack", "rc_rdma_read_request", "rc_compare_swap", "rc_atomic_ack"}) {
    Datagram d = datagram_of(golden_named(name));
    d.payload.insert(d.payload.end() - kIcrcSize, 4, 0xAB);
    reseal(d);
    EXPECT_EQ(parse(d).error(), ParseError::kUnexpectedPayload) << name;
    // With a pad count, the bytes are "pad" but still not allowed.
    d.payload[1] = static_cast<uint8_t>(d.payload[1] | 0x30);
    reseal(d);
    EXPECT_EQ(parse(d).error(), ParseError::kUnexpectedPayload) << name;
  }
}

TEST(WirePacketMalformed, AtomicWriteValueOtherThanEightBytes) {
  Datagram d = datagram_of(golden_named("rc_atomic_write"));
  d.payload.insert(d.payload.end() - kIcrcSize, 4, 0);
  reseal(d);
  EXPECT_EQ(parse(d).error(), ParseError::kBadPayloadLength);
  d.payload.erase(d.payload.end() - kIcrcSize - 8, d.payload.end() - kIcrcSize);
  reseal(d);
  EXPECT_EQ(parse(d).error(), ParseError::kBadPayloadLength);
}

TEST(WirePacketMalformed, PayloadLongerThanThePathMtu) {
  const auto& p = golden_named("rc_send_only");
  const UdpFlow flow = golden::to_flow(p.flow);
  const Headers h = golden::to_headers(p.fields);
  for (std::size_t size : {kMaxPayload - 1, kMaxPayload, kMaxPayload + 1, kMaxPayload + 4}) {
    const Bytes data(size, 0x5A);
    Bytes out(28 + encoded_size(opcode_info(Opcode::kRcSendOnly).value(), size));
    ASSERT_TRUE(encode_ip_packet(flow, h, data, out).has_value());
    const auto r = parse_ip_packet(out);
    if (size <= kMaxPayload) {
      ASSERT_TRUE(r.has_value()) << size;
      EXPECT_EQ(r->payload.size(), size);
    } else {
      EXPECT_EQ(r.error(), ParseError::kPayloadTooLong) << size;
      EXPECT_TRUE(parse_ip_packet(out, ParseLimits{.max_payload = 9000}).has_value());
    }
  }
  // A smaller path MTU is the caller's limit.
  Bytes out(28 + encoded_size(opcode_info(Opcode::kRcSendOnly).value(), 1025));
  ASSERT_TRUE(encode_ip_packet(flow, h, Bytes(1025, 1), out).has_value());
  EXPECT_EQ(parse_ip_packet(out, ParseLimits{.max_payload = 1024}).error(), ParseError::kPayloadTooLong);
}

TEST(WirePacketMalformed, NotForTheRoceV2Port) {
  const auto& p = golden_named("rc_send_only");
  Bytes b = to_bytes(p.ip_packet);
  b[22] = 0x12;  // destination port 4791 (0x12B7) -> 0x1212
  b[23] = 0x12;
  EXPECT_EQ(parse_ip_packet(b).error(), ParseError::kNotRoceV2);
}

TEST(WirePacketMalformed, HeaderImageThatDoesNotDescribeThePayload) {
  Datagram d = datagram_of(golden_named("rc_send_only"));
  d.headers.pop_back();
  EXPECT_EQ(parse(d).error(), ParseError::kBadIpUdpHeader);
  d = datagram_of(golden_named("rc_send_only"));
  d.payload.resize(d.payload.size() + 4);
  EXPECT_EQ(parse(d).error(), ParseError::kBadIpUdpHeader);
  EXPECT_EQ(parse_ip_packet(std::span<const uint8_t>()).error(), ParseError::kBadIpUdpHeader);
}

TEST(WirePacketMalformed, EveryReasonHasItsOwnName) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < kParseErrorCount; ++i) {
    const auto name = to_string(static_cast<ParseError>(i));
    EXPECT_NE(name, "unknown_parse_error");
    EXPECT_TRUE(names.insert(name).second) << name;
  }
}

TEST(WirePacketEncode, RefusesHeadersThatDoNotFitTheOpcode) {
  const auto& p = golden_named("rc_rdma_write_only");
  const auto image = golden::ip_udp_headers_of(p);
  Bytes out(512);
  Headers h = golden::to_headers(p.fields);
  ASSERT_TRUE(encode(h, p.payload, image, out).has_value());

  Headers missing = h;
  missing.reth.reset();
  EXPECT_EQ(encode(missing, p.payload, image, out).error(), std::errc::invalid_argument);
  Headers extra = h;
  extra.immdt = ImmDt{.imm = 1};
  EXPECT_EQ(encode(extra, p.payload, image, out).error(), std::errc::invalid_argument);
  Headers unknown = h;
  unknown.bth.opcode = 0x15;
  EXPECT_EQ(encode(unknown, p.payload, image, out).error(), std::errc::invalid_argument);
  for (auto bad : {&Bth::dest_qpn, &Bth::psn}) {
    Headers wide = h;
    wide.bth.*bad = kMax24 + 1;
    EXPECT_EQ(encode(wide, p.payload, image, out).error(), std::errc::invalid_argument);
  }
  Headers tver = h;
  tver.bth.tver = 16;
  EXPECT_EQ(encode(tver, p.payload, image, out).error(), std::errc::invalid_argument);
}

TEST(WirePacketEncode, RefusesPayloadsTheOpcodeDoesNotAllow) {
  const auto& ack = golden_named("rc_ack");
  Bytes out(512);
  const uint8_t one[4] = {1, 2, 3, 4};
  EXPECT_EQ(encode(golden::to_headers(ack.fields), one, golden::ip_udp_headers_of(ack), out).error(),
            std::errc::invalid_argument);
  const auto& aw = golden_named("rc_atomic_write");
  EXPECT_EQ(encode(golden::to_headers(aw.fields), one, golden::ip_udp_headers_of(aw), out).error(),
            std::errc::invalid_argument);
  Headers wide_msn = golden::to_headers(ack.fields);
  wide_msn.aeth->msn = kMax24 + 1;
  EXPECT_EQ(encode(wide_msn, {}, golden::ip_udp_headers_of(ack), out).error(), std::errc::invalid_argument);
  Headers wide_src = golden::to_headers(golden_named("ud_send_only").fields);
  wide_src.deth->src_qpn = kMax24 + 1;
  EXPECT_EQ(encode(wide_src, golden_named("ud_send_only").payload,
                   golden::ip_udp_headers_of(golden_named("ud_send_only")), out)
                .error(),
            std::errc::invalid_argument);
}

TEST(WirePacketEncode, RefusesSmallBuffersAndForeignHeaderImages) {
  const auto& p = golden_named("rc_send_only");
  const Headers h = golden::to_headers(p.fields);
  const std::size_t size = golden::udp_payload_of(p).size();
  Bytes out(size - 1);
  EXPECT_EQ(encode(h, p.payload, golden::ip_udp_headers_of(p), out).error(), std::errc::no_buffer_space);
  out.resize(size);
  // The image of another packet's length would give an ICRC for that packet.
  EXPECT_EQ(encode(h, p.payload, golden::ip_udp_headers_of(golden_named("rc_ack")), out).error(),
            std::errc::invalid_argument);
  Bytes ip(size + 27);
  EXPECT_EQ(encode_ip_packet(golden::to_flow(p.flow), h, p.payload, ip).error(), std::errc::no_buffer_space);
}

TEST(WirePacketEncode, DerivesThePadCount) {
  const auto& p = golden_named("rc_send_only");  // 16 bytes: no pad
  Headers h = golden::to_headers(p.fields);
  h.bth.pad_count = 3;
  Bytes out(golden::udp_payload_of(p).size());
  ASSERT_TRUE(encode(h, p.payload, golden::ip_udp_headers_of(p), out).has_value());
  EXPECT_EQ(out, to_bytes(golden::udp_payload_of(p)));
}

// Every opcode of the table, several payload sizes, both IP versions and
// random field values (fixed seed): parse(encode(x)) == x.
TEST(WirePacketRoundTrip, EveryOpcodeAndPayloadSize) {
  std::mt19937_64 rng(20240917);
  auto r32 = [&] { return static_cast<uint32_t>(rng()); };
  auto r24 = [&] { return static_cast<uint32_t>(rng()) & kMax24; };
  const UdpFlow v4 = golden::to_flow(golden_named("rc_send_only").flow);
  const UdpFlow v6 = golden::to_flow(golden_named("rc_send_only_v6").flow);
  int checked = 0;
  for (const OpcodeInfo& info : all_opcodes()) {
    std::vector<std::size_t> sizes;
    switch (info.payload) {
      case PayloadRule::kNone: sizes = {0}; break;
      case PayloadRule::kAtomicValue: sizes = {8}; break;
      case PayloadRule::kData: sizes = {0, 1, 2, 3, 4, 5, 255, 1024, kMaxPayload}; break;
    }
    for (const UdpFlow& flow : {v4, v6}) {
      for (std::size_t size : sizes) {
        SCOPED_TRACE(testing::Message() << info.name << " payload " << size);
        Headers h;
        h.bth = Bth{.opcode = static_cast<uint8_t>(info.opcode),
                    .solicited = (rng() & 1) != 0,
                    .migreq = (rng() & 1) != 0,
                    .pad_count = 0,
                    .tver = 0,
                    .pkey = static_cast<uint16_t>(rng()),
                    .fecn = (rng() & 1) != 0,
                    .becn = (rng() & 1) != 0,
                    .dest_qpn = r24(),
                    .ack_req = (rng() & 1) != 0,
                    .psn = r24()};
        h.bth.pad_count = static_cast<uint8_t>((4 - size % 4) % 4);
        const ExtHeaders& e = info.headers;
        if (e.deth) h.deth = Deth{.qkey = r32(), .src_qpn = r24()};
        if (e.xrceth) h.xrceth = Xrceth{.srqn = r24()};
        if (e.reth) h.reth = Reth{.va = rng(), .rkey = r32(), .dma_length = r32()};
        if (e.atomic_eth) h.atomic_eth = AtomicEth{.va = rng(), .rkey = r32(), .swap_add = rng(), .compare = rng()};
        if (e.aeth) h.aeth = Aeth{.syndrome = Syndrome::from_byte(static_cast<uint8_t>(rng())), .msn = r24()};
        if (e.atomic_ack_eth) h.atomic_ack_eth = AtomicAckEth{.original = rng()};
        if (e.immdt) h.immdt = ImmDt{.imm = r32()};
        if (e.ieth) h.ieth = Ieth{.rkey = r32()};
        Bytes data(size);
        for (auto& b : data) b = static_cast<uint8_t>(rng());

        Bytes out(48 + encoded_size(info, size));
        const auto n = encode_ip_packet(flow, h, data, out);
        ASSERT_TRUE(n.has_value());
        ASSERT_EQ(*n, ip_udp_header_size(flow).value() + encoded_size(info, size));
        const auto parsed = parse_ip_packet(std::span(out).first(*n));
        ASSERT_TRUE(parsed.has_value()) << to_string(parsed.error());
        EXPECT_EQ(parsed->headers, h);
        EXPECT_EQ(to_bytes(parsed->payload), data);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500);
}

}  // namespace
}  // namespace softhca::wire
