// The facts of IBTA vol. 1's opcode table (and of the kernel rxe's
// rxe_opcode.c, which agrees with it): per opcode, its extended headers and
// whether it carries data.
#include "wire/opcode.hpp"

#include <array>

#include "wire/headers.hpp"

namespace softhca::wire {
namespace {

constexpr std::size_t header_size_of(ExtHeaders h) {
  return kBthSize + (h.deth ? kDethSize : 0) + (h.xrceth ? kXrcethSize : 0) + (h.reth ? kRethSize : 0) + (h.atomic_eth ? kAtomicEthSize : 0) +
         (h.aeth ? kAethSize : 0) + (h.atomic_ack_eth ? kAtomicAckEthSize : 0) + (h.immdt ? kImmDtSize : 0) +
         (h.ieth ? kIethSize : 0);
}

constexpr OpcodeInfo entry(Opcode op, std::string_view name, Operation operation, Segment segment, ExtHeaders headers,
                           PayloadRule payload) {
  return OpcodeInfo{.opcode = op,
                    .name = name,
                    .transport = transport_of(static_cast<uint8_t>(op)),
                    .operation = operation,
                    .segment = segment,
                    .headers = headers,
                    .payload = payload,
                    .header_size = header_size_of(headers)};
}

using enum Operation;
using enum Segment;
using enum PayloadRule;

constexpr ExtHeaders kNoExt{};
constexpr ExtHeaders kImm{.immdt = true};
constexpr ExtHeaders kRethOnly{.reth = true};
constexpr ExtHeaders kRethImm{.reth = true, .immdt = true};
constexpr ExtHeaders kAethOnly{.aeth = true};

// RC and UC share the SEND and WRITE opcodes below 0x0C; only the transport
// bits differ. RC alone has READ, ACK, atomics and SEND WITH INVALIDATE.
constexpr std::array kTable = {
    entry(Opcode::kRcSendFirst, "RC_SEND_FIRST", kSend, kFirst, kNoExt, kData),
    entry(Opcode::kRcSendMiddle, "RC_SEND_MIDDLE", kSend, kMiddle, kNoExt, kData),
    entry(Opcode::kRcSendLast, "RC_SEND_LAST", kSend, kLast, kNoExt, kData),
    entry(Opcode::kRcSendLastWithImm, "RC_SEND_LAST_WITH_IMMEDIATE", kSend, kLast, kImm, kData),
    entry(Opcode::kRcSendOnly, "RC_SEND_ONLY", kSend, kOnly, kNoExt, kData),
    entry(Opcode::kRcSendOnlyWithImm, "RC_SEND_ONLY_WITH_IMMEDIATE", kSend, kOnly, kImm, kData),
    entry(Opcode::kRcRdmaWriteFirst, "RC_RDMA_WRITE_FIRST", kRdmaWrite, kFirst, kRethOnly, kData),
    entry(Opcode::kRcRdmaWriteMiddle, "RC_RDMA_WRITE_MIDDLE", kRdmaWrite, kMiddle, kNoExt, kData),
    entry(Opcode::kRcRdmaWriteLast, "RC_RDMA_WRITE_LAST", kRdmaWrite, kLast, kNoExt, kData),
    entry(Opcode::kRcRdmaWriteLastWithImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kRdmaWrite, kLast, kImm, kData),
    entry(Opcode::kRcRdmaWriteOnly, "RC_RDMA_WRITE_ONLY", kRdmaWrite, kOnly, kRethOnly, kData),
    entry(Opcode::kRcRdmaWriteOnlyWithImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kRdmaWrite, kOnly, kRethImm, kData),
    // A READ request names the whole range in its RETH and carries no data.
    entry(Opcode::kRcRdmaReadRequest, "RC_RDMA_READ_REQUEST", kRdmaReadRequest, kOnly, kRethOnly, kNone),
    entry(Opcode::kRcRdmaReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", kRdmaReadResponse, kFirst, kAethOnly, kData),
    entry(Opcode::kRcRdmaReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", kRdmaReadResponse, kMiddle, kNoExt, kData),
    entry(Opcode::kRcRdmaReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", kRdmaReadResponse, kLast, kAethOnly, kData),
    entry(Opcode::kRcRdmaReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", kRdmaReadResponse, kOnly, kAethOnly, kData),
    entry(Opcode::kRcAcknowledge, "RC_ACKNOWLEDGE", kAcknowledge, kOnly, kAethOnly, kNone),
    entry(Opcode::kRcAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", kAtomicAcknowledge, kOnly,
          ExtHeaders{.aeth = true, .atomic_ack_eth = true}, kNone),
    entry(Opcode::kRcCompareSwap, "RC_COMPARE_SWAP", kCompareSwap, kOnly, ExtHeaders{.atomic_eth = true}, kNone),
    entry(Opcode::kRcFetchAdd, "RC_FETCH_ADD", kFetchAdd, kOnly, ExtHeaders{.atomic_eth = true}, kNone),
    entry(Opcode::kRcSendLastWithInvalidate, "RC_SEND_LAST_WITH_INVALIDATE", kSend, kLast, ExtHeaders{.ieth = true},
          kData),
    entry(Opcode::kRcSendOnlyWithInvalidate, "RC_SEND_ONLY_WITH_INVALIDATE", kSend, kOnly, ExtHeaders{.ieth = true},
          kData),
    // ATOMIC WRITE (IBTA 1.5) targets its RETH and carries the 8-byte value
    // as payload, not in an extended header.
    entry(Opcode::kRcAtomicWrite, "RC_ATOMIC_WRITE", kAtomicWrite, kOnly, kRethOnly, kAtomicValue),

    entry(Opcode::kUcSendFirst, "UC_SEND_FIRST", kSend, kFirst, kNoExt, kData),
    entry(Opcode::kUcSendMiddle, "UC_SEND_MIDDLE", kSend, kMiddle, kNoExt, kData),
    entry(Opcode::kUcSendLast, "UC_SEND_LAST", kSend, kLast, kNoExt, kData),
    entry(Opcode::kUcSendLastWithImm, "UC_SEND_LAST_WITH_IMMEDIATE", kSend, kLast, kImm, kData),
    entry(Opcode::kUcSendOnly, "UC_SEND_ONLY", kSend, kOnly, kNoExt, kData),
    entry(Opcode::kUcSendOnlyWithImm, "UC_SEND_ONLY_WITH_IMMEDIATE", kSend, kOnly, kImm, kData),
    entry(Opcode::kUcRdmaWriteFirst, "UC_RDMA_WRITE_FIRST", kRdmaWrite, kFirst, kRethOnly, kData),
    entry(Opcode::kUcRdmaWriteMiddle, "UC_RDMA_WRITE_MIDDLE", kRdmaWrite, kMiddle, kNoExt, kData),
    entry(Opcode::kUcRdmaWriteLast, "UC_RDMA_WRITE_LAST", kRdmaWrite, kLast, kNoExt, kData),
    entry(Opcode::kUcRdmaWriteLastWithImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kRdmaWrite, kLast, kImm, kData),
    entry(Opcode::kUcRdmaWriteOnly, "UC_RDMA_WRITE_ONLY", kRdmaWrite, kOnly, kRethOnly, kData),
    entry(Opcode::kUcRdmaWriteOnlyWithImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kRdmaWrite, kOnly, kRethImm, kData),

    // UD messages are single packets: a DETH names the sender and the Q_Key.
    entry(Opcode::kUdSendOnly, "UD_SEND_ONLY", kSend, kOnly, ExtHeaders{.deth = true}, kData),
    entry(Opcode::kUdSendOnlyWithImm, "UD_SEND_ONLY_WITH_IMMEDIATE", kSend, kOnly,
          ExtHeaders{.deth = true, .immdt = true}, kData),

    // XRC: RC's requests with an XRCETH, RC's responses as they are.
    entry(Opcode::kXrcSendFirst, "XRC_SEND_FIRST", kSend, kFirst, ExtHeaders{.xrceth = true}, kData),
    entry(Opcode::kXrcSendMiddle, "XRC_SEND_MIDDLE", kSend, kMiddle, ExtHeaders{.xrceth = true}, kData),
    entry(Opcode::kXrcSendLast, "XRC_SEND_LAST", kSend, kLast, ExtHeaders{.xrceth = true}, kData),
    entry(Opcode::kXrcSendLastWithImm, "XRC_SEND_LAST_WITH_IMMEDIATE", kSend, kLast,
          ExtHeaders{.xrceth = true, .immdt = true}, kData),
    entry(Opcode::kXrcSendOnly, "XRC_SEND_ONLY", kSend, kOnly, ExtHeaders{.xrceth = true}, kData),
    entry(Opcode::kXrcSendOnlyWithImm, "XRC_SEND_ONLY_WITH_IMMEDIATE", kSend, kOnly,
          ExtHeaders{.xrceth = true, .immdt = true}, kData),
    entry(Opcode::kXrcRdmaWriteFirst, "XRC_RDMA_WRITE_FIRST", kRdmaWrite, kFirst,
          ExtHeaders{.xrceth = true, .reth = true}, kData),
    entry(Opcode::kXrcRdmaWriteMiddle, "XRC_RDMA_WRITE_MIDDLE", kRdmaWrite, kMiddle, ExtHeaders{.xrceth = true},
          kData),
    entry(Opcode::kXrcRdmaWriteLast, "XRC_RDMA_WRITE_LAST", kRdmaWrite, kLast, ExtHeaders{.xrceth = true}, kData),
    entry(Opcode::kXrcRdmaWriteLastWithImm, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kRdmaWrite, kLast,
          ExtHeaders{.xrceth = true, .immdt = true}, kData),
    entry(Opcode::kXrcRdmaWriteOnly, "XRC_RDMA_WRITE_ONLY", kRdmaWrite, kOnly,
          ExtHeaders{.xrceth = true, .reth = true}, kData),
    entry(Opcode::kXrcRdmaWriteOnlyWithImm, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kRdmaWrite, kOnly,
          ExtHeaders{.xrceth = true, .reth = true, .immdt = true}, kData),
    entry(Opcode::kXrcRdmaReadRequest, "XRC_RDMA_READ_REQUEST", kRdmaReadRequest, kOnly,
          ExtHeaders{.xrceth = true, .reth = true}, kNone),
    entry(Opcode::kXrcRdmaReadResponseFirst, "XRC_RDMA_READ_RESPONSE_FIRST", kRdmaReadResponse, kFirst, kAethOnly,
          kData),
    entry(Opcode::kXrcRdmaReadResponseMiddle, "XRC_RDMA_READ_RESPONSE_MIDDLE", kRdmaReadResponse, kMiddle, kNoExt,
          kData),
    entry(Opcode::kXrcRdmaReadResponseLast, "XRC_RDMA_READ_RESPONSE_LAST", kRdmaReadResponse, kLast, kAethOnly,
          kData),
    entry(Opcode::kXrcRdmaReadResponseOnly, "XRC_RDMA_READ_RESPONSE_ONLY", kRdmaReadResponse, kOnly, kAethOnly,
          kData),
    entry(Opcode::kXrcAcknowledge, "XRC_ACKNOWLEDGE", kAcknowledge, kOnly, kAethOnly, kNone),
    entry(Opcode::kXrcAtomicAcknowledge, "XRC_ATOMIC_ACKNOWLEDGE", kAtomicAcknowledge, kOnly,
          ExtHeaders{.aeth = true, .atomic_ack_eth = true}, kNone),
    entry(Opcode::kXrcCompareSwap, "XRC_COMPARE_SWAP", kCompareSwap, kOnly,
          ExtHeaders{.xrceth = true, .atomic_eth = true}, kNone),
    entry(Opcode::kXrcFetchAdd, "XRC_FETCH_ADD", kFetchAdd, kOnly, ExtHeaders{.xrceth = true, .atomic_eth = true},
          kNone),
    entry(Opcode::kXrcSendLastWithInvalidate, "XRC_SEND_LAST_WITH_INVALIDATE", kSend, kLast,
          ExtHeaders{.xrceth = true, .ieth = true}, kData),
    entry(Opcode::kXrcSendOnlyWithInvalidate, "XRC_SEND_ONLY_WITH_INVALIDATE", kSend, kOnly,
          ExtHeaders{.xrceth = true, .ieth = true}, kData),
};

// Opcode byte -> position in kTable, or -1: a constant-time lookup for the
// receive path, built at compile time so there is no mutable state.
constexpr auto kIndex = [] {
  std::array<int8_t, 256> index{};
  index.fill(-1);
  for (std::size_t i = 0; i < kTable.size(); ++i) index[static_cast<uint8_t>(kTable[i].opcode)] = static_cast<int8_t>(i);
  return index;
}();

static_assert(kTable.size() < 128);
static_assert(header_size_of(ExtHeaders{.xrceth = true, .reth = true, .immdt = true}) == 36);
static_assert(header_size_of(ExtHeaders{.reth = true, .immdt = true}) == 32);
static_assert(header_size_of(ExtHeaders{.aeth = true, .atomic_ack_eth = true}) == 24);
static_assert(header_size_of(ExtHeaders{.atomic_eth = true}) == 40);

}  // namespace

std::optional<OpcodeInfo> opcode_info(uint8_t opcode) {
  const int8_t i = kIndex[opcode];
  if (i < 0) return std::nullopt;
  return kTable[static_cast<std::size_t>(i)];
}

std::span<const OpcodeInfo> all_opcodes() { return kTable; }

}  // namespace softhca::wire
