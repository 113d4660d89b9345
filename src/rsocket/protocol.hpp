// The rsocket wire protocol of rdma-core's librdmacm (docs/architecture.md,
// "rsockets"): what travels in the connection's private data and in the
// 32-bit immediate of every RDMA WRITE WITH IMMEDIATE, so that a softhca
// rsocket can talk to an rdma-core one. Pure values; no verbs calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

namespace softhca::rsocket {

// Immediate data: bits 31..29 are the operation, bits 28..0 its argument
// (bytes written for kData, the receive credit limit for kSgl, a code for
// kCtrl). The values are rdma-core's; gaps are reserved there too.
enum class MsgOp : uint32_t {
  kData = 0,
  kWrite = 2,  // never on the wire: a local marker in rdma-core
  kSgl = 4,
  kIomapSgl = 6,
  kCtrl = 7,
};

enum class CtrlCode : uint32_t {
  kDisconnect = 0,
  kKeepalive = 1,
  kShutdown = 2,
};

inline constexpr uint32_t kMsgDataMask = 0x1FFFFFFF;

constexpr uint32_t msg_encode(MsgOp op, uint32_t data) {
  return (static_cast<uint32_t>(op) << 29) | (data & kMsgDataMask);
}
constexpr MsgOp msg_op(uint32_t msg) { return static_cast<MsgOp>(msg >> 29); }
constexpr uint32_t msg_data(uint32_t msg) { return msg & kMsgDataMask; }

// A remote buffer as the protocol names it: 16 bytes, written by the peer
// into our target SGL array with RDMA WRITE. Host byte order (rdma-core
// swaps only when the two hosts' byte orders differ, RS_CONN_FLAG_NET).
struct RemoteSge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(RemoteSge) == 16);

// One entry of the iomap array (riomap): the peer's offset and the buffer.
struct IomapEntry {
  uint64_t offset;
  RemoteSge sge;
};
static_assert(sizeof(IomapEntry) == 24);

// Protocol constants shared with rdma-core (its RS_* values).
inline constexpr uint32_t kTargetSglEntries = 2;  // RS_SGL_SIZE
inline constexpr uint32_t kCtrlSlots = 4;          // RS_QP_CTRL_SIZE: in-flight control messages
inline constexpr uint32_t kSendLowWater = 2048;    // RS_SNDLOWAT
inline constexpr uint32_t kMaxTransfer = 65536;    // RS_MAX_TRANSFER
inline constexpr uint32_t kFirstTransfer = 2048;   // RS_OLAP_START_SIZE
inline constexpr uint16_t kQpMinSize = 16;
inline constexpr uint16_t kQpMaxSize = 0xFFFE;

inline constexpr uint8_t kConnVersion = 1;
inline constexpr uint8_t kConnFlagNet = 1 << 0;    // sender is big endian
inline constexpr uint8_t kConnFlagIomap = 1 << 1;  // target_iomap_size is meaningful

// The private data of the connect request and of the reply (rs_conn_data):
// 40 bytes, every multi-byte field big endian on the wire.
struct ConnData {
  uint8_t version = kConnVersion;
  uint8_t flags = 0;
  uint16_t credits = 0;            // the sender's receive queue depth
  uint8_t target_iomap_size = 0;   // log2-scaled entry count of its iomap array
  RemoteSge target_sgl{};          // where to write buffer grants (length: entries)
  RemoteSge data_buf{};            // the first half of its receive buffer
};

inline constexpr size_t kConnDataSize = 40;

void encode_conn_data(const ConnData& data, uint8_t (&out)[kConnDataSize]);
// nullopt when the bytes are too few or the version is not ours.
std::optional<ConnData> decode_conn_data(const void* bytes, size_t len);

// rdma-core's rs_value_to_scale / rs_scale_to_value: small values as is,
// larger ones as a power of two with the top bit set.
uint32_t value_to_scale(uint32_t value, int bits);
uint32_t scale_to_value(uint32_t scale, int bits);

}  // namespace softhca::rsocket
