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

// A multicast GID: ff00::/8, or the IPv4-mapped form of 224.0.0.0/4 that
// RoCE uses for IPv4 groups (the kernel's rdma_is_multicast_addr).
bool is_multicast_gid(const uint8_t* gid);

}  // namespace softhca::wire
