// The 40 bytes a UD receiver finds before the payload: the network header of
// the packet as RoCEv2 HCAs write it into the receive buffer — an IPv6
// header, or for IPv4-mapped GIDs 20 zero bytes then the IPv4 header.
#pragma once

#include <cstdint>

namespace softhca::wire {

inline constexpr uint32_t kUdGrhBytes = 40;
// The flow label is a 20-bit field of the GRH and of the IPv6 header. The
// verbs carry it in a uint32_t; like the kernel and mlx5 (whose QP and AH
// contexts hold 20 bits), softhca keeps only those bits of what it is given.
inline constexpr uint32_t kFlowLabelMask = 0xFFFFF;
// IBA: the destination QP of every multicast packet.
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// Writes the GRH area for a UD message of `payload` bytes from `sgid` to
// `dgid` (16 bytes each); hop_limit 0 means the default of 64; the flow
// label (20 bits) goes into an IPv6 header only.
void build_ud_grh(unsigned char* grh, const uint8_t* sgid, const uint8_t* dgid, uint32_t payload,
                  uint8_t traffic_class, uint8_t hop_limit, uint32_t flow_label);

// The network header type of a RoCEv2 datagram, as mlx5 reports it in wc.sl
// of a UD receive on an Ethernet port (the CQE's L3 header type; rdma-core's
// mlx5 provider copies that field into wc.sl unchanged): 1 for IPv6, 2 for
// IPv4. UCX's ud_verbs reads it to know where the destination address sits
// in the 40-byte GRH area (2: the IPv4 address in its last 4 bytes, anything
// else: the IPv6 destination in its last 16; the kernel's mlx5 driver also
// reads only the low bits there, and so softhca reports the type alone).
// rxe leaves wc.sl at 0 for user CQs, which UCX would take for IPv6 even on
// an IPv4 datagram; softhca follows mlx5, the device UCX was written against.
inline constexpr uint8_t kRoceHeaderIpv6 = 1;
inline constexpr uint8_t kRoceHeaderIpv4 = 2;

// The header type of a GRH area build_ud_grh wrote: IPv4 when it holds an
// IPv4 header in its last 20 bytes, IPv6 otherwise.
uint8_t ud_grh_header_type(const unsigned char* grh);

// A multicast GID: ff00::/8, or the IPv4-mapped form of 224.0.0.0/4 that
// RoCE uses for IPv4 groups (the kernel's rdma_is_multicast_addr).
bool is_multicast_gid(const uint8_t* gid);

}  // namespace softhca::wire
