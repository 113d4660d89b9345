#include "wire/ip_udp.hpp"

#include <algorithm>

#include "wire/big_endian.hpp"

namespace softhca::wire {
namespace {

constexpr uint8_t kIpv4VersionIhl = 0x45;  // version 4, five 32-bit words: no options
constexpr uint16_t kIpv4DontFragment = 0x4000;
constexpr uint16_t kIpv4MoreFragments = 0x2000;
constexpr uint16_t kIpv4FragmentOffsetMask = 0x1FFF;
constexpr std::size_t kMaxUdpLength = 0xFFFF;

// Offsets inside the IPv4 and IPv6 headers.
constexpr std::size_t kV4TotalLength = 2, kV4Id = 4, kV4FlagsFragment = 6, kV4Protocol = 9, kV4Checksum = 10,
                      kV4Src = 12, kV4Dst = 16;
constexpr std::size_t kV6PayloadLength = 4, kV6NextHeader = 6, kV6Src = 8, kV6Dst = 24;
// Offsets inside the UDP header.
constexpr std::size_t kUdpSrcPort = 0, kUdpDstPort = 2, kUdpLength = 4, kUdpChecksum = 6;

// The Internet checksum's running sum (RFC 1071): 16-bit big-endian words,
// an odd last byte padded with zero; 64 bits cannot overflow on any span.
uint64_t sum_words(std::span<const uint8_t> data, uint64_t sum = 0) {
  std::size_t i = 0;
  for (; i + 1 < data.size(); i += 2) sum += load_be16(data.data() + i);
  if (i < data.size()) sum += static_cast<uint64_t>(data[i]) << 8;
  return sum;
}

// Folds the carries back in and complements.
uint16_t finish(uint64_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

std::size_t ip_header_size(IpVersion v) { return v == IpVersion::kV4 ? kIpv4HeaderSize : kIpv6HeaderSize; }

}  // namespace

Result<IpVersion> ip_version_of(const UdpFlow& flow) {
  const bool src4 = is_ipv4_mapped(flow.src_gid);
  if (src4 != is_ipv4_mapped(flow.dst_gid)) return fail(std::errc::invalid_argument);
  return src4 ? IpVersion::kV4 : IpVersion::kV6;
}

Result<std::size_t> ip_udp_header_size(const UdpFlow& flow) {
  const auto version = ip_version_of(flow);
  if (!version) return fail(version.error());
  return ip_header_size(*version) + kUdpHeaderSize;
}

Result<std::size_t> write_ip_udp_headers(const UdpFlow& flow, std::size_t udp_payload_size, std::span<uint8_t> out,
                                         uint16_t ipv4_id) {
  const auto version = ip_version_of(flow);
  if (!version) return fail(version.error());
  const std::size_t ip_size = ip_header_size(*version);
  const std::size_t size = ip_size + kUdpHeaderSize;
  // Both IPv4's total length and UDP's length are 16-bit fields.
  const std::size_t udp_length = kUdpHeaderSize + udp_payload_size;
  if (udp_payload_size > kMaxUdpLength || udp_length + (*version == IpVersion::kV4 ? ip_size : 0) > kMaxUdpLength) {
    return fail(std::errc::invalid_argument);
  }
  if (out.size() < size) return fail(std::errc::no_buffer_space);
  uint8_t* ip = out.data();
  std::fill_n(ip, size, uint8_t{0});
  if (*version == IpVersion::kV4) {
    ip[0] = kIpv4VersionIhl;
    ip[1] = flow.traffic_class;
    store_be16(ip + kV4TotalLength, static_cast<uint16_t>(ip_size + udp_length));
    // The IP ID: 0 is Linux's choice for DF datagrams of an unconnected
    // socket, and the value the receiver's image assumes.
    store_be16(ip + kV4Id, ipv4_id);
    store_be16(ip + kV4FlagsFragment, kIpv4DontFragment);
    ip[8] = flow.hop_limit;
    ip[kV4Protocol] = kIpProtoUdp;
    std::copy_n(flow.src_gid.data() + 12, 4, ip + kV4Src);
    std::copy_n(flow.dst_gid.data() + 12, 4, ip + kV4Dst);
    store_be16(ip + kV4Checksum, finish(sum_words(std::span<const uint8_t>(ip, kIpv4HeaderSize))));
  } else {
    // Version 6, then the traffic class and the 20-bit flow label.
    store_be32(ip, (6U << 28) | (static_cast<uint32_t>(flow.traffic_class) << 20) | (flow.flow_label & 0xFFFFF));
    store_be16(ip + kV6PayloadLength, static_cast<uint16_t>(udp_length));
    ip[kV6NextHeader] = kIpProtoUdp;
    ip[7] = flow.hop_limit;
    std::copy_n(flow.src_gid.data(), 16, ip + kV6Src);
    std::copy_n(flow.dst_gid.data(), 16, ip + kV6Dst);
  }
  uint8_t* udp = ip + ip_size;
  store_be16(udp + kUdpSrcPort, flow.src_port);
  store_be16(udp + kUdpDstPort, flow.dst_port);
  store_be16(udp + kUdpLength, static_cast<uint16_t>(udp_length));
  return size;
}

Result<IpVersion> check_ip_udp_headers(std::span<const uint8_t> headers, std::size_t udp_payload_size) {
  if (headers.empty()) return fail(std::errc::invalid_argument);
  const uint8_t* ip = headers.data();
  IpVersion version;
  if (ip[0] == kIpv4VersionIhl) {
    version = IpVersion::kV4;
  } else if ((ip[0] >> 4) == 6) {
    version = IpVersion::kV6;
  } else {
    // IPv4 with options is refused too: the ICRC's masked image (and rxe's)
    // assumes the UDP header right after a 20-byte IPv4 header.
    return fail(std::errc::invalid_argument);
  }
  const std::size_t ip_size = ip_header_size(version);
  if (headers.size() != ip_size + kUdpHeaderSize) return fail(std::errc::invalid_argument);
  const std::size_t udp_length = kUdpHeaderSize + udp_payload_size;
  if (version == IpVersion::kV4) {
    const uint16_t flags_fragment = load_be16(ip + kV4FlagsFragment);
    // A fragment is not a whole datagram: the ICRC cannot be checked on it.
    if ((flags_fragment & (kIpv4MoreFragments | kIpv4FragmentOffsetMask)) != 0) return fail(std::errc::invalid_argument);
    if (ip[kV4Protocol] != kIpProtoUdp) return fail(std::errc::invalid_argument);
    if (load_be16(ip + kV4TotalLength) != ip_size + udp_length) return fail(std::errc::invalid_argument);
  } else {
    if (ip[kV6NextHeader] != kIpProtoUdp) return fail(std::errc::invalid_argument);
    if (load_be16(ip + kV6PayloadLength) != udp_length) return fail(std::errc::invalid_argument);
  }
  if (load_be16(ip + ip_size + kUdpLength) != udp_length) return fail(std::errc::invalid_argument);
  return version;
}

Result<IpUdpView> split_ip_udp(std::span<const uint8_t> ip_packet) {
  if (ip_packet.empty()) return fail(std::errc::invalid_argument);
  const bool v4 = (ip_packet[0] >> 4) == 4;
  const std::size_t ip_size = v4 ? kIpv4HeaderSize : kIpv6HeaderSize;
  const std::size_t header_size = ip_size + kUdpHeaderSize;
  if (ip_packet.size() < header_size) return fail(std::errc::invalid_argument);
  // The UDP length decides where the datagram ends; check_ip_udp_headers
  // then holds the IP length to the same value.
  const std::size_t udp_length = load_be16(ip_packet.data() + ip_size + kUdpLength);
  if (udp_length < kUdpHeaderSize || header_size + (udp_length - kUdpHeaderSize) > ip_packet.size()) {
    return fail(std::errc::invalid_argument);
  }
  const std::size_t payload_size = udp_length - kUdpHeaderSize;
  IpUdpView view;
  view.headers = ip_packet.first(header_size);
  const auto version = check_ip_udp_headers(view.headers, payload_size);
  if (!version) return fail(version.error());
  view.version = *version;
  view.udp_payload = ip_packet.subspan(header_size, payload_size);
  view.src_port = load_be16(ip_packet.data() + ip_size + kUdpSrcPort);
  view.dst_port = load_be16(ip_packet.data() + ip_size + kUdpDstPort);
  return view;
}

Result<void> fill_udp_checksum(std::span<uint8_t> ip_packet) {
  const auto view = split_ip_udp(ip_packet);
  if (!view) return fail(view.error());
  const std::size_t ip_size = ip_header_size(view->version);
  const std::size_t udp_length = kUdpHeaderSize + view->udp_payload.size();
  uint8_t* udp = ip_packet.data() + ip_size;
  store_be16(udp + kUdpChecksum, 0);
  // The pseudo-header: addresses, protocol and UDP length (RFC 768, RFC 8200).
  uint64_t sum = 0;
  if (view->version == IpVersion::kV4) {
    sum = sum_words(ip_packet.subspan(kV4Src, 8));
  } else {
    sum = sum_words(ip_packet.subspan(kV6Src, 32));
  }
  sum += kIpProtoUdp + udp_length;
  sum = sum_words(std::span<const uint8_t>(udp, udp_length), sum);
  uint16_t checksum = finish(sum);
  // Zero means "no checksum" in UDP, so a computed zero is sent as its
  // ones-complement twin.
  if (checksum == 0) checksum = 0xFFFF;
  store_be16(udp + kUdpChecksum, checksum);
  return {};
}

}  // namespace softhca::wire
