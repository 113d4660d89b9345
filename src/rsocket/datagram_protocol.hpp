// The datagram rsocket protocol of rdma-core's librdmacm (docs/architecture.md,
// "Datagram rsockets"): the header in front of every datagram on a UD QP,
// naming the sender's address, and the header of the address service's UDP
// messages, which carry the sender's QPN until both sides have an address
// handle. Pure values; no verbs calls.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "rsocket/protocol.hpp"

namespace softhca::rsocket {

// ds_header: version (4 or 6), its own length, the sender's UDP port, then
// its IPv4 address, or IPv6 flow info and address. Port, address and flow
// info are in network order (copied from the sockaddr as they are).
inline constexpr uint8_t kDsHeaderV4Len = 8;
inline constexpr uint8_t kDsHeaderV6Len = 24;
inline constexpr size_t kDsHeaderMaxLen = kDsHeaderV6Len;

// ds_udp_header: tag, version, op (MsgOp::kData or MsgOp::kCtrl), length,
// reserved, the sender's QPN (big endian, low 24 bits), its IP address.
inline constexpr uint32_t kDsUdpTag = 0x55555555;
inline constexpr uint8_t kDsUdpHeaderV4Len = 16;
inline constexpr uint8_t kDsUdpHeaderV6Len = 28;
inline constexpr size_t kDsUdpHeaderMaxLen = kDsUdpHeaderV6Len;

// Every datagram, header included, fits one receive slot of this size
// (rdma-core's RS_SNDLOWAT).
inline constexpr uint32_t kDatagramSlotSize = kSendLowWater;

// Our extension, not rdma-core's: a datagram larger than the path MTU
// allows crosses the UD QP in fragments, each led by this header; the first
// fragment then carries the ds_header. Its first byte (0x80 | IP version)
// is no valid ds_header version, so an rdma-core peer drops fragments, as
// it would drop such a datagram on its own QP. Fields: marker, length (8),
// the datagram's length (big endian), its id (big endian, per sender),
// this fragment's index and the fragment count.
inline constexpr uint8_t kFragMarker = 0x80;
inline constexpr uint8_t kFragHeaderLen = 8;

struct FragHeader {
  uint16_t total;
  uint16_t id;
  uint8_t index;
  uint8_t count;
};
void encode_frag_header(const FragHeader& h, uint8_t version, uint8_t (&out)[kFragHeaderLen]);
// nullopt when the bytes are no fragment header.
std::optional<FragHeader> decode_frag_header(const uint8_t* bytes, size_t len);

// Writes the header naming `addr` (AF_INET or AF_INET6) to out; returns its
// length (0 for another family).
size_t encode_ds_header(const sockaddr_storage& addr, uint8_t (&out)[kDsHeaderMaxLen]);
// The sender's address from a received header and the header's length;
// nullopt when the bytes are no valid header.
struct DsHeaderView {
  sockaddr_storage src;
  uint8_t length;
};
std::optional<DsHeaderView> decode_ds_header(const uint8_t* bytes, size_t len);

struct DsUdpHeader {
  MsgOp op;
  uint32_t qpn;
  uint8_t length;
};
size_t encode_ds_udp_header(MsgOp op, uint32_t qpn, const sockaddr_storage& local,
                            uint8_t (&out)[kDsUdpHeaderMaxLen]);
// nullopt unless tag, version and length are right for a message that came
// from an address of family `from_family`.
std::optional<DsUdpHeader> decode_ds_udp_header(const uint8_t* bytes, size_t len, int from_family);

}  // namespace softhca::rsocket
