// The CM MAD codec: CM messages as IB CM MADs (IBTA vol. 1, ch. 12) and the
// IP addressing header rdma_cm puts at the start of their private data.
// (Not to be confused with src/wire, the RoCE packet headers: a MAD is the
// payload of such a packet, or of a local transport's record.)
//
// Every message is one 256-byte MAD: a 24-byte common MAD header (base version
// 1, management class 0x07 "CM", class version 2, method 0x03 "Send") followed
// by the 232-byte CM payload laid out as IBTA tables 106-113 say (fields are
// big-endian, sub-byte fields counted from the most significant bit). The same
// bytes travel between processes of this host (cm/service.hpp) and, later,
// inside RoCE v2 packets to QP1 of other hosts, so captures decode in Wireshark.
//
// Pure: encode/decode only, no I/O. decode() validates everything it reads and
// never trusts a length from the peer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "common/result.hpp"

namespace softhca::cm {

using Gid = std::array<uint8_t, 16>;

inline constexpr std::size_t kMadSize = 256;
inline constexpr std::size_t kMadHeaderSize = 24;
inline constexpr std::size_t kCmPayloadSize = kMadSize - kMadHeaderSize;  // 232

inline constexpr uint8_t kMadBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;
inline constexpr uint8_t kMadMethodSend = 0x03;

// CM attribute IDs (IBTA table 104).
enum class AttrId : uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,  // alternate paths: not implemented
  kApr = 0x001A,
};

// Private data capacity of each message.
inline constexpr std::size_t kReqPrivateDataSize = 92;
inline constexpr std::size_t kRepPrivateDataSize = 196;
inline constexpr std::size_t kRejPrivateDataSize = 148;
inline constexpr std::size_t kRtuPrivateDataSize = 224;
inline constexpr std::size_t kDreqPrivateDataSize = 220;
inline constexpr std::size_t kDrepPrivateDataSize = 224;
inline constexpr std::size_t kMraPrivateDataSize = 222;
inline constexpr std::size_t kRejAriSize = 72;

// REJ reasons used here (IBTA table 109; the kernel's enum ib_cm_rej_reason).
enum class RejReason : uint16_t {
  kNoQp = 1,
  kNoResources = 3,
  kTimeout = 4,
  kInvalidCommId = 6,
  kInvalidServiceId = 8,
  kStaleConnection = 10,
  kConsumerDefined = 28,
  kVendorOptionNotSupported = 35,
};

// REJ "message rejected" field.
enum class RejectedMessage : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// Transport service type of a REQ (2 bits): RC 0, UC 1, RD 2.
enum class TransportType : uint8_t { kRc = 0, kUc = 1, kRd = 2 };

struct ReqMsg {
  uint32_t local_comm_id = 0;
  uint32_t vendor_id = 0;  // 24 bits (ECE)
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;               // 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;              // 24 bits
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;             // 24 bits
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  TransportType transport = TransportType::kRc;
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;            // 24 bits
  uint8_t local_cm_response_timeout = 0;  // 5 bits
  uint8_t retry_count = 0;              // 3 bits
  uint16_t pkey = 0;
  uint8_t path_mtu = 0;                 // 4 bits, enum ibv_mtu
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;          // 3 bits
  uint8_t max_cm_retries = 0;           // 4 bits
  bool srq = false;
  uint8_t extended_transport = 0;       // 3 bits
  uint16_t primary_local_lid = 0;
  uint16_t primary_remote_lid = 0;
  Gid primary_local_gid{};
  Gid primary_remote_gid{};
  uint32_t primary_flow_label = 0;      // 20 bits
  uint8_t primary_packet_rate = 0;      // 6 bits
  uint8_t primary_traffic_class = 0;
  uint8_t primary_hop_limit = 0;
  uint8_t primary_sl = 0;               // 4 bits
  bool primary_subnet_local = false;
  uint8_t primary_local_ack_timeout = 0;  // 5 bits
  std::array<uint8_t, kReqPrivateDataSize> private_data{};

  bool operator==(const ReqMsg&) const = default;
};

struct RepMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;          // 24 bits
  uint32_t vendor_id = 0;          // 24 bits, split over three bytes on the wire
  uint32_t local_eecn = 0;         // 24 bits
  uint32_t starting_psn = 0;       // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;    // 5 bits
  uint8_t failover_accepted = 0;   // 2 bits
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;     // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateDataSize> private_data{};

  bool operator==(const RepMsg&) const = default;
};

struct RejMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  RejectedMessage message_rejected = RejectedMessage::kReq;
  uint8_t ari_length = 0;          // 7 bits
  uint16_t reason = 0;
  std::array<uint8_t, kRejAriSize> ari{};
  std::array<uint8_t, kRejPrivateDataSize> private_data{};

  bool operator==(const RejMsg&) const = default;
};

struct RtuMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateDataSize> private_data{};

  bool operator==(const RtuMsg&) const = default;
};

struct DreqMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;         // 24 bits
  std::array<uint8_t, kDreqPrivateDataSize> private_data{};

  bool operator==(const DreqMsg&) const = default;
};

struct DrepMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateDataSize> private_data{};

  bool operator==(const DrepMsg&) const = default;
};

// MRA "message MRAed" field (2 bits).
enum class MraedMessage : uint8_t { kReq = 0, kRep = 1, kLap = 2 };

// Message receipt acknowledgement (table 107): "your message arrived, the
// answer will take up to 4.096 us * 2^service_timeout".
struct MraMsg {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  MraedMessage message_mraed = MraedMessage::kReq;
  uint8_t service_timeout = 0;     // 5 bits
  std::array<uint8_t, kMraPrivateDataSize> private_data{};

  bool operator==(const MraMsg&) const = default;
};

// Service ID resolution (UD): table 119 and 120.
inline constexpr std::size_t kSidrReqPrivateDataSize = 216;
inline constexpr std::size_t kSidrRepPrivateDataSize = 136;
inline constexpr std::size_t kSidrRepAddInfoSize = 72;

// SIDR_REP status values (IBTA table 121; the kernel's enum ib_cm_sidr_status).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // no such service ID
  kReject = 2,       // the service rejected the request
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};

struct SidrReqMsg {
  uint32_t request_id = 0;
  uint16_t pkey = 0;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateDataSize> private_data{};

  bool operator==(const SidrReqMsg&) const = default;
};

struct SidrRepMsg {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t add_info_length = 0;
  uint32_t vendor_id = 0;  // 24 bits: 16 at byte 6, 8 at byte 11
  uint32_t qpn = 0;        // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, kSidrRepAddInfoSize> add_info{};
  std::array<uint8_t, kSidrRepPrivateDataSize> private_data{};

  bool operator==(const SidrRepMsg&) const = default;
};

using CmMessage = std::variant<ReqMsg, RepMsg, RejMsg, RtuMsg, DreqMsg, DrepMsg, SidrReqMsg, SidrRepMsg, MraMsg>;

// One MAD: the transaction ID of the common header plus the CM payload.
struct Mad {
  uint64_t tid = 0;
  CmMessage msg;
};

using MadBytes = std::array<uint8_t, kMadSize>;

AttrId attr_id_of(const CmMessage& msg);
const char* message_name(const CmMessage& msg);

MadBytes encode(const Mad& mad);
// Errors: invalid_argument (not 256 bytes, not a CM MAD we understand),
// not_supported (a CM attribute we do not implement: LAP, APR).
Result<Mad> decode(std::span<const uint8_t> bytes);

// ---- rdma_cm's IP addressing header (struct cma_hdr in the kernel) ---------
// 36 bytes at the start of REQ (and SIDR_REQ) private data: version 0, IP
// version in the high nibble of byte 1, the *source* port, then source and
// destination addresses; an IPv4 address sits in the last 4 of its 16 bytes.
inline constexpr std::size_t kIpHeaderSize = 36;
inline constexpr uint8_t kCmaVersion = 0x00;
// What an application may put after the header in a REQ and a SIDR_REQ.
inline constexpr std::size_t kReqUserPrivateDataSize = kReqPrivateDataSize - kIpHeaderSize;  // 56
inline constexpr std::size_t kSidrReqUserPrivateDataSize = kSidrReqPrivateDataSize - kIpHeaderSize;  // 180

struct IpHeader {
  uint8_t ip_version = 4;  // 4 or 6
  uint16_t src_port = 0;   // host order
  Gid src{};               // IPv4: ::ffff:a.b.c.d form (the mapped prefix is not on the wire)
  Gid dst{};

  bool operator==(const IpHeader&) const = default;
};

void encode_ip_header(const IpHeader& hdr, std::span<uint8_t, kIpHeaderSize> out);
// Errors: invalid_argument (cma version not 0, IP version not 4 or 6).
Result<IpHeader> decode_ip_header(std::span<const uint8_t, kIpHeaderSize> in);

// ---- service IDs of the IP port spaces ---------------------------------------
// rdma_cm's service ID for port space `ps` (RDMA_PS_TCP, ...) and `port`:
// (ps << 16) + port, as the kernel's cma_get_service_id builds it.
inline constexpr uint64_t service_id(uint16_t ps, uint16_t port) { return (uint64_t{ps} << 16) | port; }
inline constexpr uint16_t service_id_port(uint64_t sid) { return static_cast<uint16_t>(sid & 0xFFFF); }
inline constexpr uint16_t service_id_ps(uint64_t sid) { return static_cast<uint16_t>((sid >> 16) & 0xFFFF); }
// True when `sid` lies in an IP port space (upper 32 bits zero).
inline constexpr bool is_ip_service_id(uint64_t sid) { return (sid >> 32) == 0; }

}  // namespace softhca::cm
