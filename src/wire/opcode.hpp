// BTH opcodes (IBTA vol. 1, table "OpCode field" of the BTH) and what each one
// puts on the wire after the BTH. The table is the single place that knows
// which extended headers an opcode carries, in which order, and whether it has
// a payload: the encoder, the parser and later the transport all ask it, so
// they cannot disagree.
//
// Only the opcodes softhca speaks are in the table: RC, UC and UD. RD (0x40),
// CNP (0x81), FLUSH (0x1C, which needs the FETH) and the reserved codes are
// "unknown" to the parser, so a peer that sends them is dropped and counted
// rather than half-understood.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace softhca::wire {

// The top three opcode bits name the transport service.
enum class Transport : uint8_t { kRc = 0, kUc = 1, kRd = 2, kUd = 3, kXrc = 5 };

enum class Opcode : uint8_t {
  kRcSendFirst = 0x00,
  kRcSendMiddle = 0x01,
  kRcSendLast = 0x02,
  kRcSendLastWithImm = 0x03,
  kRcSendOnly = 0x04,
  kRcSendOnlyWithImm = 0x05,
  kRcRdmaWriteFirst = 0x06,
  kRcRdmaWriteMiddle = 0x07,
  kRcRdmaWriteLast = 0x08,
  kRcRdmaWriteLastWithImm = 0x09,
  kRcRdmaWriteOnly = 0x0A,
  kRcRdmaWriteOnlyWithImm = 0x0B,
  kRcRdmaReadRequest = 0x0C,
  kRcRdmaReadResponseFirst = 0x0D,
  kRcRdmaReadResponseMiddle = 0x0E,
  kRcRdmaReadResponseLast = 0x0F,
  kRcRdmaReadResponseOnly = 0x10,
  kRcAcknowledge = 0x11,
  kRcAtomicAcknowledge = 0x12,
  kRcCompareSwap = 0x13,
  kRcFetchAdd = 0x14,
  kRcSendLastWithInvalidate = 0x16,
  kRcSendOnlyWithInvalidate = 0x17,
  kRcAtomicWrite = 0x1D,

  kUcSendFirst = 0x20,
  kUcSendMiddle = 0x21,
  kUcSendLast = 0x22,
  kUcSendLastWithImm = 0x23,
  kUcSendOnly = 0x24,
  kUcSendOnlyWithImm = 0x25,
  kUcRdmaWriteFirst = 0x26,
  kUcRdmaWriteMiddle = 0x27,
  kUcRdmaWriteLast = 0x28,
  kUcRdmaWriteLastWithImm = 0x29,
  kUcRdmaWriteOnly = 0x2A,
  kUcRdmaWriteOnlyWithImm = 0x2B,

  kUdSendOnly = 0x64,
  kUdSendOnlyWithImm = 0x65,

  // XRC: RC's operations with the transport bits 101. Requests carry an
  // XRCETH after the BTH; responses are RC's, renamed.
  kXrcSendFirst = 0xA0,
  kXrcSendMiddle = 0xA1,
  kXrcSendLast = 0xA2,
  kXrcSendLastWithImm = 0xA3,
  kXrcSendOnly = 0xA4,
  kXrcSendOnlyWithImm = 0xA5,
  kXrcRdmaWriteFirst = 0xA6,
  kXrcRdmaWriteMiddle = 0xA7,
  kXrcRdmaWriteLast = 0xA8,
  kXrcRdmaWriteLastWithImm = 0xA9,
  kXrcRdmaWriteOnly = 0xAA,
  kXrcRdmaWriteOnlyWithImm = 0xAB,
  kXrcRdmaReadRequest = 0xAC,
  kXrcRdmaReadResponseFirst = 0xAD,
  kXrcRdmaReadResponseMiddle = 0xAE,
  kXrcRdmaReadResponseLast = 0xAF,
  kXrcRdmaReadResponseOnly = 0xB0,
  kXrcAcknowledge = 0xB1,
  kXrcAtomicAcknowledge = 0xB2,
  kXrcCompareSwap = 0xB3,
  kXrcFetchAdd = 0xB4,
  kXrcSendLastWithInvalidate = 0xB6,
  kXrcSendOnlyWithInvalidate = 0xB7,
};

// An XRC opcode's RC twin and back: the low five bits name the operation.
constexpr uint8_t kTransportBits = 0xE0;
constexpr uint8_t kXrcTransportBits = 0xA0;
constexpr uint8_t rc_twin(uint8_t xrc_opcode) { return static_cast<uint8_t>(xrc_opcode & ~kTransportBits); }
constexpr uint8_t xrc_twin(uint8_t rc_opcode) { return static_cast<uint8_t>(rc_opcode | kXrcTransportBits); }

// What the packet asks of its receiver, independent of segmentation.
enum class Operation : uint8_t {
  kSend,
  kRdmaWrite,
  kRdmaReadRequest,
  kRdmaReadResponse,
  kAcknowledge,
  kAtomicAcknowledge,
  kCompareSwap,
  kFetchAdd,
  kAtomicWrite,
};

// The packet's place in its message: a message is FIRST MIDDLE* LAST, or ONLY.
enum class Segment : uint8_t { kFirst, kMiddle, kLast, kOnly };

// Which extended transport headers follow the BTH. The wire order is fixed
// and is the order of the members: DETH, XRCETH, RETH, AtomicETH, AETH,
// AtomicAckETH, ImmDt, IETH (no opcode carries a pair whose order differs).
struct ExtHeaders {
  bool deth = false;
  bool xrceth = false;
  bool reth = false;
  bool atomic_eth = false;
  bool aeth = false;
  bool atomic_ack_eth = false;
  bool immdt = false;
  bool ieth = false;
  friend constexpr bool operator==(const ExtHeaders&, const ExtHeaders&) = default;
};

enum class PayloadRule : uint8_t {
  kNone,       // headers only: any byte after them but the ICRC is an error
  kData,       // zero up to the path MTU bytes of message data
  kAtomicValue // exactly the 8-byte value of an ATOMIC WRITE
};

struct OpcodeInfo {
  Opcode opcode;
  std::string_view name;  // the IBTA name, e.g. "RC_SEND_ONLY"
  Transport transport;
  Operation operation;
  Segment segment;
  ExtHeaders headers;
  PayloadRule payload;
  std::size_t header_size;  // BTH and extended headers: where the payload starts
};

// The table entry of an opcode byte; nullopt for one softhca does not speak.
std::optional<OpcodeInfo> opcode_info(uint8_t opcode);
inline std::optional<OpcodeInfo> opcode_info(Opcode opcode) { return opcode_info(static_cast<uint8_t>(opcode)); }

// Every opcode of the table, in opcode order (tests and diagnostics).
std::span<const OpcodeInfo> all_opcodes();

constexpr Transport transport_of(uint8_t opcode) { return static_cast<Transport>(opcode >> 5); }

}  // namespace softhca::wire
