// Each transport header codec against bytes written out from IBTA vol. 1's
// field tables (9.2 BTH, 9.3 extended headers): big-endian, bit 7 of a byte
// is its first bit, reserved fields zero.
#include "wire/headers.hpp"

#include <gtest/gtest.h>

#include <array>

namespace softhca::wire {
namespace {

template <std::size_t N>
using Bytes = std::array<uint8_t, N>;

TEST(WireBth, GoldenBytes) {
  const Bth bth{.opcode = 0x0A,
                .solicited = true,
                .migreq = false,
                .pad_count = 2,
                .tver = 0,
                .pkey = 0x8001,
                .fecn = true,
                .becn = false,
                .dest_qpn = 0xABCDEF,
                .ack_req = true,
                .psn = 0x123456};
  const Bytes<12> expected = {0x0A, 0xA0, 0x80, 0x01, 0x80, 0xAB, 0xCD, 0xEF, 0x80, 0x12, 0x34, 0x56};
  Bytes<12> out{};
  encode_bth(bth, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_bth(expected), bth);
}

TEST(WireBth, EveryFlagHasItsOwnBit) {
  const Bytes<12> flags = {0x00, 0x40 | 0x0F, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  const Bth b = decode_bth(flags);
  EXPECT_FALSE(b.solicited);
  EXPECT_TRUE(b.migreq);
  EXPECT_EQ(b.pad_count, 0);
  EXPECT_EQ(b.tver, 0x0F);
  EXPECT_FALSE(b.fecn);
  EXPECT_TRUE(b.becn);
  EXPECT_FALSE(b.ack_req);
  const Bytes<12> pad = {0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(decode_bth(pad).pad_count, 3);
  EXPECT_EQ(decode_bth(pad).tver, 0);
}

TEST(WireBth, ReservedBitsChangeNoFieldAndOnlyResv7IsCarried) {
  // resv6 (byte 4, bits 5-0) and resv7 (byte 8, bits 6-0) all set.
  const Bytes<12> in = {0x04, 0x00, 0xFF, 0xFF, 0x3F, 0x00, 0x00, 0x11, 0x7F, 0x00, 0x00, 0x01};
  const Bth b = decode_bth(in);
  EXPECT_FALSE(b.fecn);
  EXPECT_FALSE(b.becn);
  EXPECT_FALSE(b.ack_req);
  EXPECT_EQ(b.dest_qpn, 0x11u);
  EXPECT_EQ(b.psn, 1u);
  // resv7 is where softhca peers mark selective recovery (transport/selective.hpp).
  EXPECT_EQ(b.reserved7, 0x7F);
  Bytes<12> out{};
  encode_bth(b, out);
  EXPECT_EQ(out[4], 0x00);
  EXPECT_EQ(out[8], 0x7F);
  // A header built without them sends zeros; they never reach AckReq.
  encode_bth(Bth{.opcode = 0x04, .ack_req = false, .reserved7 = 0xFF, .psn = 1}, out);
  EXPECT_EQ(out[8], 0x7F);
  encode_bth(Bth{.opcode = 0x04, .psn = 1}, out);
  EXPECT_EQ(out[8], 0x00);
}

TEST(WireBth, NarrowFieldsAreMaskedNotSpilled) {
  Bytes<12> out{};
  encode_bth(Bth{.opcode = 0x04, .pad_count = 7, .tver = 0x1F, .dest_qpn = 0x1FFFFFF, .psn = 0xFF000001}, out);
  EXPECT_EQ(out[1], 0x3F);  // pad 3, tver 15: neither reaches SE or M
  EXPECT_EQ(out[4], 0x00);  // the QPN's 25th bit does not land in FECN
  EXPECT_EQ((Bytes<3>{out[5], out[6], out[7]}), (Bytes<3>{0xFF, 0xFF, 0xFF}));
  EXPECT_EQ(out[8], 0x00);  // nor the PSN's high byte in AckReq
  EXPECT_EQ((Bytes<3>{out[9], out[10], out[11]}), (Bytes<3>{0x00, 0x00, 0x01}));
}

TEST(WireReth, GoldenBytes) {
  const Reth reth{.va = 0x0102030405060708, .rkey = 0x090A0B0C, .dma_length = 0x0D0E0F10};
  const Bytes<16> expected = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  Bytes<16> out{};
  encode_reth(reth, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_reth(expected), reth);
}

TEST(WireAtomicEth, GoldenBytes) {
  const AtomicEth a{.va = 0x1122334455667788, .rkey = 0x99AABBCC, .swap_add = 0x0102030405060708,
                    .compare = 0xF1F2F3F4F5F6F7F8};
  const Bytes<28> expected = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0x01, 0x02,
                              0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8};
  Bytes<28> out{};
  encode_atomic_eth(a, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_atomic_eth(expected), a);
}

TEST(WireAtomicAckEth, GoldenBytes) {
  const Bytes<8> expected = {0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0x00, 0x00, 0x01};
  Bytes<8> out{};
  encode_atomic_ack_eth(AtomicAckEth{.original = 0xDEADBEEF00000001}, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_atomic_ack_eth(expected).original, 0xDEADBEEF00000001u);
}

TEST(WireImmDtIeth, GoldenBytes) {
  const Bytes<4> expected = {0x12, 0x34, 0x56, 0x78};
  Bytes<4> out{};
  encode_immdt(ImmDt{.imm = 0x12345678}, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_immdt(expected).imm, 0x12345678u);
  out = {};
  encode_ieth(Ieth{.rkey = 0x12345678}, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_ieth(expected).rkey, 0x12345678u);
}

TEST(WireDeth, GoldenBytesWithReservedByte) {
  const Deth d{.qkey = 0x80010000, .src_qpn = 0xABCDEF};
  const Bytes<8> expected = {0x80, 0x01, 0x00, 0x00, 0x00, 0xAB, 0xCD, 0xEF};
  Bytes<8> out{};
  out.fill(0x55);
  encode_deth(d, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_deth(expected), d);
  // The reserved byte between Q_Key and source QPN is ignored on receive.
  Bytes<8> reserved_set = expected;
  reserved_set[4] = 0xFF;
  EXPECT_EQ(decode_deth(reserved_set), d);
}

TEST(WireXrceth, GoldenBytesWithReservedByte) {
  const Xrceth x{.srqn = 0x123456};
  const Bytes<4> expected = {0x00, 0x12, 0x34, 0x56};
  Bytes<4> out{};
  out.fill(0x55);
  encode_xrceth(x, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_xrceth(expected), x);
  // The reserved byte before the SRQ number is ignored on receive.
  Bytes<4> reserved_set = expected;
  reserved_set[0] = 0xFF;
  EXPECT_EQ(decode_xrceth(reserved_set), x);
}

TEST(WireAeth, GoldenBytes) {
  const Aeth a{.syndrome = Syndrome::rnr_nak(14), .msn = 0x010203};
  const Bytes<4> expected = {0x2E, 0x01, 0x02, 0x03};
  Bytes<4> out{};
  encode_aeth(a, out);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(decode_aeth(expected), a);
}

TEST(WireAeth, SyndromeBytesOfEveryKind) {
  // IBTA table "AETH syndrome field": bits 6-5 are 00 ACK, 01 RNR NAK,
  // 10 reserved, 11 NAK; bits 4-0 carry the credit code, timer or NAK code.
  EXPECT_EQ(Syndrome::ack(0).byte(), 0x00);
  EXPECT_EQ(Syndrome::ack(Syndrome::kNoCredits).byte(), 0x1F);
  EXPECT_EQ(Syndrome::ack(10).byte(), 0x0A);
  EXPECT_EQ(Syndrome::rnr_nak(0).byte(), 0x20);
  EXPECT_EQ(Syndrome::rnr_nak(31).byte(), 0x3F);
  EXPECT_EQ(Syndrome::nak(NakCode::kPsnSequenceError).byte(), 0x60);
  EXPECT_EQ(Syndrome::nak(NakCode::kInvalidRequest).byte(), 0x61);
  EXPECT_EQ(Syndrome::nak(NakCode::kRemoteAccessError).byte(), 0x62);
  EXPECT_EQ(Syndrome::nak(NakCode::kRemoteOperationalError).byte(), 0x63);
  EXPECT_EQ(Syndrome::nak(NakCode::kInvalidRdRequest).byte(), 0x64);
  // Values wider than five bits cannot change the kind.
  EXPECT_EQ(Syndrome::ack(0xFF).kind(), SyndromeKind::kAck);
  EXPECT_EQ(Syndrome::rnr_nak(0xE1).byte(), 0x21);
}

TEST(WireAeth, ClassifiesReceivedSyndromes) {
  for (int byte = 0; byte < 256; ++byte) {
    const Syndrome s = Syndrome::from_byte(static_cast<uint8_t>(byte));
    EXPECT_EQ(s.byte(), byte);
    EXPECT_EQ(static_cast<int>(s.kind()), (byte >> 5) & 3) << byte;
    EXPECT_EQ(s.value(), byte & 0x1F);
    EXPECT_EQ(s.is_ack(), ((byte >> 5) & 3) == 0);
    EXPECT_EQ(s.is_rnr_nak(), ((byte >> 5) & 3) == 1);
    const bool defined_nak = ((byte >> 5) & 3) == 3 && (byte & 0x1F) <= 4;
    EXPECT_EQ(s.nak_code().has_value(), defined_nak) << byte;
    if (defined_nak) {
      EXPECT_EQ(static_cast<int>(*s.nak_code()), byte & 0x1F);
    }
  }
  EXPECT_EQ(Syndrome::from_byte(0x40).kind(), SyndromeKind::kReserved);
  EXPECT_EQ(Syndrome::from_byte(0x62).nak_code(), NakCode::kRemoteAccessError);
  EXPECT_EQ(Syndrome::from_byte(0x2E).value(), 14);
}

}  // namespace
}  // namespace softhca::wire
