#include "wire/headers.hpp"

#include "wire/big_endian.hpp"

namespace softhca::wire {
namespace {

// BTH byte 1: SE, M, PadCnt (2 bits), TVer (4 bits), from the top bit down.
constexpr uint8_t kSolicitedBit = 0x80;
constexpr uint8_t kMigReqBit = 0x40;
constexpr unsigned kPadShift = 4;
constexpr uint8_t kTverMask = 0x0F;
// BTH byte 4: FECN, BECN, then six reserved bits.
constexpr uint8_t kFecnBit = 0x80;
constexpr uint8_t kBecnBit = 0x40;
// BTH byte 8: AckReq, then seven reserved bits.
constexpr uint8_t kAckReqBit = 0x80;

}  // namespace

void encode_bth(const Bth& h, std::span<uint8_t, kBthSize> out) {
  uint8_t* p = out.data();
  p[0] = h.opcode;
  p[1] = static_cast<uint8_t>((h.solicited ? kSolicitedBit : 0) | (h.migreq ? kMigReqBit : 0) |
                              ((h.pad_count & 0x3) << kPadShift) | (h.tver & kTverMask));
  store_be16(p + 2, h.pkey);
  p[4] = static_cast<uint8_t>((h.fecn ? kFecnBit : 0) | (h.becn ? kBecnBit : 0));
  store_be24(p + 5, h.dest_qpn & kMax24);
  p[8] = static_cast<uint8_t>((h.ack_req ? kAckReqBit : 0) | (h.reserved7 & ~kAckReqBit));
  store_be24(p + 9, h.psn & kMax24);
}

Bth decode_bth(std::span<const uint8_t, kBthSize> in) {
  const uint8_t* p = in.data();
  Bth h;
  h.opcode = p[0];
  h.solicited = (p[1] & kSolicitedBit) != 0;
  h.migreq = (p[1] & kMigReqBit) != 0;
  h.pad_count = static_cast<uint8_t>((p[1] >> kPadShift) & 0x3);
  h.tver = p[1] & kTverMask;
  h.pkey = load_be16(p + 2);
  h.fecn = (p[4] & kFecnBit) != 0;
  h.becn = (p[4] & kBecnBit) != 0;
  h.dest_qpn = load_be24(p + 5);
  h.ack_req = (p[8] & kAckReqBit) != 0;
  h.reserved7 = p[8] & static_cast<uint8_t>(~kAckReqBit);
  h.psn = load_be24(p + 9);
  return h;
}

void encode_reth(const Reth& h, std::span<uint8_t, kRethSize> out) {
  store_be64(out.data(), h.va);
  store_be32(out.data() + 8, h.rkey);
  store_be32(out.data() + 12, h.dma_length);
}

Reth decode_reth(std::span<const uint8_t, kRethSize> in) {
  return Reth{.va = load_be64(in.data()), .rkey = load_be32(in.data() + 8), .dma_length = load_be32(in.data() + 12)};
}

void encode_aeth(const Aeth& h, std::span<uint8_t, kAethSize> out) {
  out[0] = h.syndrome.byte();
  store_be24(out.data() + 1, h.msn & kMax24);
}

Aeth decode_aeth(std::span<const uint8_t, kAethSize> in) {
  return Aeth{.syndrome = Syndrome::from_byte(in[0]), .msn = load_be24(in.data() + 1)};
}

void encode_atomic_eth(const AtomicEth& h, std::span<uint8_t, kAtomicEthSize> out) {
  store_be64(out.data(), h.va);
  store_be32(out.data() + 8, h.rkey);
  store_be64(out.data() + 12, h.swap_add);
  store_be64(out.data() + 20, h.compare);
}

AtomicEth decode_atomic_eth(std::span<const uint8_t, kAtomicEthSize> in) {
  return AtomicEth{.va = load_be64(in.data()),
                   .rkey = load_be32(in.data() + 8),
                   .swap_add = load_be64(in.data() + 12),
                   .compare = load_be64(in.data() + 20)};
}

void encode_atomic_ack_eth(const AtomicAckEth& h, std::span<uint8_t, kAtomicAckEthSize> out) {
  store_be64(out.data(), h.original);
}

AtomicAckEth decode_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthSize> in) {
  return AtomicAckEth{.original = load_be64(in.data())};
}

void encode_immdt(const ImmDt& h, std::span<uint8_t, kImmDtSize> out) { store_be32(out.data(), h.imm); }

ImmDt decode_immdt(std::span<const uint8_t, kImmDtSize> in) { return ImmDt{.imm = load_be32(in.data())}; }

void encode_ieth(const Ieth& h, std::span<uint8_t, kIethSize> out) { store_be32(out.data(), h.rkey); }

Ieth decode_ieth(std::span<const uint8_t, kIethSize> in) { return Ieth{.rkey = load_be32(in.data())}; }

// DETH: Q_Key, one reserved byte, then the 24-bit source QPN.
void encode_deth(const Deth& h, std::span<uint8_t, kDethSize> out) {
  store_be32(out.data(), h.qkey);
  out[4] = 0;
  store_be24(out.data() + 5, h.src_qpn & kMax24);
}

Deth decode_deth(std::span<const uint8_t, kDethSize> in) {
  return Deth{.qkey = load_be32(in.data()), .src_qpn = load_be24(in.data() + 5)};
}

// XRCETH: one reserved byte, then the 24-bit XRC SRQ number.
void encode_xrceth(const Xrceth& h, std::span<uint8_t, kXrcethSize> out) {
  out[0] = 0;
  store_be24(out.data() + 1, h.srqn & kMax24);
}

Xrceth decode_xrceth(std::span<const uint8_t, kXrcethSize> in) { return Xrceth{.srqn = load_be24(in.data() + 1)}; }

}  // namespace softhca::wire
