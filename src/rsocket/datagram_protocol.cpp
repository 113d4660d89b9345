#include "rsocket/datagram_protocol.hpp"

#include <endian.h>
#include <netinet/in.h>

#include <cstring>

namespace softhca::rsocket {

size_t encode_ds_header(const sockaddr_storage& addr, uint8_t (&out)[kDsHeaderMaxLen]) {
  std::memset(out, 0, sizeof out);
  if (addr.ss_family == AF_INET) {
    const auto& sin = reinterpret_cast<const sockaddr_in&>(addr);
    out[0] = 4;
    out[1] = kDsHeaderV4Len;
    std::memcpy(out + 2, &sin.sin_port, 2);
    std::memcpy(out + 4, &sin.sin_addr, 4);
    return kDsHeaderV4Len;
  }
  if (addr.ss_family == AF_INET6) {
    const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(addr);
    out[0] = 6;
    out[1] = kDsHeaderV6Len;
    std::memcpy(out + 2, &sin6.sin6_port, 2);
    std::memcpy(out + 4, &sin6.sin6_flowinfo, 4);
    std::memcpy(out + 8, &sin6.sin6_addr, 16);
    return kDsHeaderV6Len;
  }
  return 0;
}

std::optional<DsHeaderView> decode_ds_header(const uint8_t* bytes, size_t len) {
  if (len < kDsHeaderV4Len) return std::nullopt;
  DsHeaderView v{};
  if (bytes[0] == 4 && bytes[1] == kDsHeaderV4Len) {
    auto& sin = reinterpret_cast<sockaddr_in&>(v.src);
    sin.sin_family = AF_INET;
    std::memcpy(&sin.sin_port, bytes + 2, 2);
    std::memcpy(&sin.sin_addr, bytes + 4, 4);
    v.length = kDsHeaderV4Len;
    return v;
  }
  if (bytes[0] == 6 && bytes[1] == kDsHeaderV6Len && len >= kDsHeaderV6Len) {
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(v.src);
    sin6.sin6_family = AF_INET6;
    std::memcpy(&sin6.sin6_port, bytes + 2, 2);
    std::memcpy(&sin6.sin6_flowinfo, bytes + 4, 4);
    std::memcpy(&sin6.sin6_addr, bytes + 8, 16);
    v.length = kDsHeaderV6Len;
    return v;
  }
  return std::nullopt;
}

size_t encode_ds_udp_header(MsgOp op, uint32_t qpn, const sockaddr_storage& local,
                            uint8_t (&out)[kDsUdpHeaderMaxLen]) {
  std::memset(out, 0, sizeof out);
  const uint32_t tag = htobe32(kDsUdpTag);
  const uint32_t qpn_be = htobe32(qpn & 0xFFFFFF);
  std::memcpy(out, &tag, 4);
  out[5] = static_cast<uint8_t>(op);
  std::memcpy(out + 8, &qpn_be, 4);
  if (local.ss_family == AF_INET) {
    out[4] = 4;
    out[6] = kDsUdpHeaderV4Len;
    std::memcpy(out + 12, &reinterpret_cast<const sockaddr_in&>(local).sin_addr, 4);
    return kDsUdpHeaderV4Len;
  }
  if (local.ss_family == AF_INET6) {
    out[4] = 6;
    out[6] = kDsUdpHeaderV6Len;
    std::memcpy(out + 12, &reinterpret_cast<const sockaddr_in6&>(local).sin6_addr, 16);
    return kDsUdpHeaderV6Len;
  }
  return 0;
}

std::optional<DsUdpHeader> decode_ds_udp_header(const uint8_t* bytes, size_t len, int from_family) {
  if (len < kDsUdpHeaderV4Len) return std::nullopt;
  uint32_t tag;
  std::memcpy(&tag, bytes, 4);
  if (be32toh(tag) != kDsUdpTag) return std::nullopt;
  const uint8_t version = bytes[4];
  const uint8_t length = bytes[6];
  const bool v4 = version == 4 && from_family == AF_INET && length == kDsUdpHeaderV4Len;
  const bool v6 = version == 6 && from_family == AF_INET6 && length == kDsUdpHeaderV6Len;
  if (!(v4 || v6) || len < length) return std::nullopt;
  const auto op = static_cast<MsgOp>(bytes[5]);
  if (op != MsgOp::kData && op != MsgOp::kCtrl) return std::nullopt;
  uint32_t qpn;
  std::memcpy(&qpn, bytes + 8, 4);
  return DsUdpHeader{op, be32toh(qpn) & 0xFFFFFF, length};
}

void encode_frag_header(const FragHeader& h, uint8_t version, uint8_t (&out)[kFragHeaderLen]) {
  out[0] = static_cast<uint8_t>(kFragMarker | version);
  out[1] = kFragHeaderLen;
  const uint16_t total = htobe16(h.total);
  const uint16_t id = htobe16(h.id);
  std::memcpy(out + 2, &total, 2);
  std::memcpy(out + 4, &id, 2);
  out[6] = h.index;
  out[7] = h.count;
}

std::optional<FragHeader> decode_frag_header(const uint8_t* bytes, size_t len) {
  if (len < kFragHeaderLen || (bytes[0] & kFragMarker) == 0 || bytes[1] != kFragHeaderLen) return std::nullopt;
  FragHeader h{};
  uint16_t v;
  std::memcpy(&v, bytes + 2, 2);
  h.total = be16toh(v);
  std::memcpy(&v, bytes + 4, 2);
  h.id = be16toh(v);
  h.index = bytes[6];
  h.count = bytes[7];
  if (h.count < 2 || h.index >= h.count) return std::nullopt;
  return h;
}

}  // namespace softhca::rsocket
