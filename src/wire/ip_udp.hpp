// The IPv4/IPv6 and UDP headers around a RoCEv2 packet.
//
// The ICRC covers the IP and UDP headers (with their per-hop fields masked),
// but a user-space link never sees the headers the kernel writes or strips.
// So both sides rebuild the same header image from what they know: the
// addresses, the ports and the length. The image is what Linux sends from an
// unconnected UDP socket: IPv4 without options, with DF set and IP ID 0 (the
// kernel's choice for DF datagrams of unconnected sockets with
// IP_PMTUDISC_DO; the segments of a GSO send get 0, 1, 2, ..., see
// icrc_ipv4_id_delta), or IPv6 with UDP as the next header. Fields the ICRC masks (TOS/traffic class, TTL/hop limit,
// flow label, both checksums) may differ on the wire without harm.
//
// These helpers also serve captures: a header image plus its UDP payload is a
// whole IP packet that Wireshark decodes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/result.hpp"

namespace softhca::wire {

// RoCEv2's IANA-assigned UDP destination port.
inline constexpr uint16_t kRoceV2Port = 4791;

inline constexpr std::size_t kIpv4HeaderSize = 20;
inline constexpr std::size_t kIpv6HeaderSize = 40;
inline constexpr std::size_t kUdpHeaderSize = 8;
inline constexpr uint8_t kIpProtoUdp = 17;

// A RoCEv2 GID: an IPv6 address, with IPv4 written as ::ffff:a.b.c.d.
using Gid = std::array<uint8_t, 16>;

enum class IpVersion : uint8_t { kV4 = 4, kV6 = 6 };

constexpr bool is_ipv4_mapped(const Gid& gid) {
  for (std::size_t i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xFF && gid[11] == 0xFF;
}

// One direction of a RoCEv2 flow, as its IP and UDP headers state it.
struct UdpFlow {
  Gid src_gid{};  // both IPv4-mapped: an IPv4 packet; neither: IPv6
  Gid dst_gid{};
  uint16_t src_port = 0;  // RoCEv2 uses it as flow entropy
  uint16_t dst_port = kRoceV2Port;
  uint8_t traffic_class = 0;  // IPv4 TOS or IPv6 traffic class (DSCP and ECN)
  uint8_t hop_limit = 64;     // IPv4 TTL or IPv6 hop limit
  uint32_t flow_label = 0;    // IPv6 only, 20 bits
};

// IPv4 when both GIDs are IPv4-mapped, IPv6 when neither is; mixing them is
// invalid_argument.
Result<IpVersion> ip_version_of(const UdpFlow& flow);

// The size of the IP and UDP headers of the flow: 28 or 48 bytes.
Result<std::size_t> ip_udp_header_size(const UdpFlow& flow);

// Writes the IP and UDP headers of a datagram carrying `udp_payload_size`
// bytes and returns their size. The IPv4 header checksum is computed; the UDP
// checksum is left 0 because the payload is not there yet (fill_udp_checksum).
// `ipv4_id` is the IPv4 ID: 0 for a datagram sent alone, i for the i-th
// segment of a GSO send (the kernel numbers them upward from the lone
// datagram's 0); IPv6 has none and ignores it.
// invalid_argument for a mixed flow or a payload too long for one datagram,
// no_buffer_space when `out` is too small.
Result<std::size_t> write_ip_udp_headers(const UdpFlow& flow, std::size_t udp_payload_size, std::span<uint8_t> out,
                                         uint16_t ipv4_id = 0);

// Checks that `headers` is exactly an IP header of the supported form (IPv4
// without options and not a fragment, or IPv6 whose next header is UDP)
// followed by a UDP header, and that their length fields describe a UDP
// payload of `udp_payload_size` bytes. Returns the IP version.
Result<IpVersion> check_ip_udp_headers(std::span<const uint8_t> headers, std::size_t udp_payload_size);

// A received IP packet cut at the end of its UDP header.
struct IpUdpView {
  IpVersion version = IpVersion::kV4;
  std::span<const uint8_t> headers;      // IP and UDP headers
  std::span<const uint8_t> udp_payload;  // as long as the UDP length says
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
};

// Splits an IP packet of the supported form (check_ip_udp_headers). Bytes
// past the IP length (link-layer padding) are not part of the view.
Result<IpUdpView> split_ip_udp(std::span<const uint8_t> ip_packet);

// Computes the UDP checksum of a whole IP packet and stores it. A kernel
// socket does this itself; captures need it, since IPv6 forbids a zero one.
Result<void> fill_udp_checksum(std::span<uint8_t> ip_packet);

}  // namespace softhca::wire
