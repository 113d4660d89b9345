// The IBA transport headers of a RoCEv2 packet (IBTA vol. 1, 9.2-9.3) as plain
// structs, with big-endian encoders and decoders over fixed-size spans.
//
// The fixed extents make each codec's buffer size part of its type, so the
// only length checks are the ones the packet layer does before it slices the
// buffer. Encoders write reserved fields as zero; decoders ignore them, as
// IBTA asks of receivers. Fields narrower than their C++ type (24-bit QPNs and
// PSNs, the 2-bit pad count, the 4-bit TVer) are masked on encode; the packet
// encoder rejects out-of-range values before it gets here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace softhca::wire {

inline constexpr std::size_t kBthSize = 12;
inline constexpr std::size_t kRethSize = 16;
inline constexpr std::size_t kAethSize = 4;
inline constexpr std::size_t kAtomicEthSize = 28;
inline constexpr std::size_t kAtomicAckEthSize = 8;
inline constexpr std::size_t kImmDtSize = 4;
inline constexpr std::size_t kIethSize = 4;
inline constexpr std::size_t kDethSize = 8;
inline constexpr std::size_t kXrcethSize = 4;

// QPNs, PSNs and MSNs are 24-bit numbers on the wire.
inline constexpr uint32_t kMax24 = 0xFF'FFFF;
// The only transport header version IBTA defines.
inline constexpr uint8_t kTransportVersion = 0;

// Base Transport Header: in every packet.
struct Bth {
  uint8_t opcode = 0;
  bool solicited = false;  // SE: the receiver's CQ notification should fire
  bool migreq = false;     // APM migration state; softhca has no alternate paths
  uint8_t pad_count = 0;   // 0-3 bytes after the payload to reach a 4-byte multiple
  uint8_t tver = kTransportVersion;
  uint16_t pkey = 0xFFFF;
  bool fecn = false;  // congestion marks (Annex A17); the ICRC does not cover them
  bool becn = false;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  // The seven reserved bits under AckReq: zero on the wire IBTA describes;
  // softhca peers mark their selective recovery in them (transport/selective.hpp).
  uint8_t reserved7 = 0;
  uint32_t psn = 0;
  friend constexpr bool operator==(const Bth&, const Bth&) = default;
};

// RDMA Extended Transport Header: the target of a WRITE, READ or ATOMIC WRITE.
struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;  // of the whole message, not of this packet
  friend constexpr bool operator==(const Reth&, const Reth&) = default;
};

// The AETH syndrome's kind, in bits 6-5 of the syndrome byte.
enum class SyndromeKind : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };

// NAK codes (IBTA table "AETH syndrome field"); 5-31 are reserved.
enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};

// The AETH syndrome byte: bit 7 reserved, bits 6-5 the kind, bits 4-0 a value
// whose meaning depends on the kind (credit code, RNR timer code, NAK code).
class Syndrome {
 public:
  // The credit code that says "no credit count": what a responder without
  // end-to-end flow control advertises.
  static constexpr uint8_t kNoCredits = 0x1F;

  constexpr Syndrome() = default;
  static constexpr Syndrome from_byte(uint8_t byte) { return Syndrome(byte); }
  // An ACK; credit_code is IBTA's 5-bit logarithmic credit code, not a count.
  static constexpr Syndrome ack(uint8_t credit_code) { return make(SyndromeKind::kAck, credit_code); }
  // An RNR NAK; timer is the 5-bit min_rnr_timer code of the responder's QP.
  static constexpr Syndrome rnr_nak(uint8_t timer) { return make(SyndromeKind::kRnrNak, timer); }
  static constexpr Syndrome nak(NakCode code) { return make(SyndromeKind::kNak, static_cast<uint8_t>(code)); }

  constexpr uint8_t byte() const { return byte_; }
  constexpr SyndromeKind kind() const { return static_cast<SyndromeKind>((byte_ >> 5) & 0x3); }
  // The low five bits: credit code, RNR timer or NAK code, by kind().
  constexpr uint8_t value() const { return byte_ & 0x1F; }
  constexpr bool is_ack() const { return kind() == SyndromeKind::kAck; }
  constexpr bool is_rnr_nak() const { return kind() == SyndromeKind::kRnrNak; }
  // The NAK code of a NAK whose code IBTA defines; nullopt for anything else.
  constexpr std::optional<NakCode> nak_code() const {
    if (kind() != SyndromeKind::kNak || value() > static_cast<uint8_t>(NakCode::kInvalidRdRequest)) return std::nullopt;
    return static_cast<NakCode>(value());
  }
  friend constexpr bool operator==(const Syndrome&, const Syndrome&) = default;

 private:
  constexpr explicit Syndrome(uint8_t byte) : byte_(byte) {}
  static constexpr Syndrome make(SyndromeKind kind, uint8_t value) {
    return Syndrome(static_cast<uint8_t>((static_cast<uint8_t>(kind) << 5) | (value & 0x1F)));
  }
  uint8_t byte_ = 0;
};

// ACK Extended Transport Header: in ACKs, NAKs, atomic ACKs and the first,
// last and only packets of a READ response (a middle one has none).
struct Aeth {
  Syndrome syndrome;
  uint32_t msn = 0;  // 24 bits: messages the responder has completed
  friend constexpr bool operator==(const Aeth&, const Aeth&) = default;
};

// Atomic Extended Transport Header: a COMPARE SWAP or FETCH ADD request.
struct AtomicEth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;  // the swap value, or the addend of FETCH ADD
  uint64_t compare = 0;   // unused by FETCH ADD
  friend constexpr bool operator==(const AtomicEth&, const AtomicEth&) = default;
};

// Atomic ACK Extended Transport Header: the value before the atomic.
struct AtomicAckEth {
  uint64_t original = 0;
  friend constexpr bool operator==(const AtomicAckEth&, const AtomicAckEth&) = default;
};

// Immediate data. The wire value read big-endian: verbs' imm_data (__be32) is
// the same four bytes, so the engine converts with ntohl/htonl at its edge.
struct ImmDt {
  uint32_t imm = 0;
  friend constexpr bool operator==(const ImmDt&, const ImmDt&) = default;
};

// Invalidate Extended Transport Header: the rkey a SEND WITH INVALIDATE kills.
struct Ieth {
  uint32_t rkey = 0;
  friend constexpr bool operator==(const Ieth&, const Ieth&) = default;
};

// Datagram Extended Transport Header: UD's Q_Key and the sender's QPN.
struct Deth {
  uint32_t qkey = 0;
  uint32_t src_qpn = 0;  // 24 bits
  friend constexpr bool operator==(const Deth&, const Deth&) = default;
};

// XRC Extended Transport Header: in every XRC request packet, right after
// the BTH; the SRQ at the responder that the message is for.
struct Xrceth {
  uint32_t srqn = 0;  // 24 bits
  friend constexpr bool operator==(const Xrceth&, const Xrceth&) = default;
};

void encode_bth(const Bth& h, std::span<uint8_t, kBthSize> out);
Bth decode_bth(std::span<const uint8_t, kBthSize> in);
void encode_reth(const Reth& h, std::span<uint8_t, kRethSize> out);
Reth decode_reth(std::span<const uint8_t, kRethSize> in);
void encode_aeth(const Aeth& h, std::span<uint8_t, kAethSize> out);
Aeth decode_aeth(std::span<const uint8_t, kAethSize> in);
void encode_atomic_eth(const AtomicEth& h, std::span<uint8_t, kAtomicEthSize> out);
AtomicEth decode_atomic_eth(std::span<const uint8_t, kAtomicEthSize> in);
void encode_atomic_ack_eth(const AtomicAckEth& h, std::span<uint8_t, kAtomicAckEthSize> out);
AtomicAckEth decode_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthSize> in);
void encode_immdt(const ImmDt& h, std::span<uint8_t, kImmDtSize> out);
ImmDt decode_immdt(std::span<const uint8_t, kImmDtSize> in);
void encode_ieth(const Ieth& h, std::span<uint8_t, kIethSize> out);
Ieth decode_ieth(std::span<const uint8_t, kIethSize> in);
void encode_deth(const Deth& h, std::span<uint8_t, kDethSize> out);
Deth decode_deth(std::span<const uint8_t, kDethSize> in);
void encode_xrceth(const Xrceth& h, std::span<uint8_t, kXrcethSize> out);
Xrceth decode_xrceth(std::span<const uint8_t, kXrcethSize> in);

}  // namespace softhca::wire
