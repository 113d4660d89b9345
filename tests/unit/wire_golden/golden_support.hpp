// Turns the plain structs of golden_packets.hpp into the codec's types, and
// names the golden packets for parameterized tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "wire/ip_udp.hpp"
#include "wire/packet.hpp"
#include "golden_packets.hpp"

namespace softhca::wire::golden {

inline UdpFlow to_flow(const Flow& f) {
  UdpFlow flow;
  std::copy_n(f.src_gid, 16, flow.src_gid.begin());
  std::copy_n(f.dst_gid, 16, flow.dst_gid.begin());
  flow.src_port = f.src_port;
  flow.dst_port = f.dst_port;
  flow.traffic_class = f.traffic_class;
  flow.hop_limit = f.hop_limit;
  flow.flow_label = f.flow_label;
  return flow;
}

inline Headers to_headers(const Fields& f) {
  Headers h;
  h.bth = Bth{.opcode = f.opcode,
              .solicited = f.solicited,
              .migreq = f.migreq,
              .pad_count = f.pad_count,
              .tver = 0,
              .pkey = f.pkey,
              .fecn = f.fecn,
              .becn = f.becn,
              .dest_qpn = f.dest_qpn,
              .ack_req = f.ack_req,
              .psn = f.psn};
  if (f.has_deth) h.deth = Deth{.qkey = f.deth_qkey, .src_qpn = f.deth_src_qpn};
  if (f.has_reth) h.reth = Reth{.va = f.reth_va, .rkey = f.reth_rkey, .dma_length = f.reth_dma_length};
  if (f.has_atomic_eth) {
    h.atomic_eth = AtomicEth{
        .va = f.atomic_va, .rkey = f.atomic_rkey, .swap_add = f.atomic_swap_add, .compare = f.atomic_compare};
  }
  if (f.has_aeth) h.aeth = Aeth{.syndrome = Syndrome::from_byte(f.aeth_syndrome), .msn = f.aeth_msn};
  if (f.has_atomic_ack_eth) h.atomic_ack_eth = AtomicAckEth{.original = f.atomic_ack_original};
  if (f.has_immdt) h.immdt = ImmDt{.imm = f.imm};
  if (f.has_ieth) h.ieth = Ieth{.rkey = f.ieth_rkey};
  return h;
}

// Where the UDP payload (BTH onward) starts inside a golden IP packet.
inline std::size_t udp_payload_offset(const Packet& p) {
  return (p.flow.ipv6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize;
}

inline std::span<const uint8_t> ip_udp_headers_of(const Packet& p) { return p.ip_packet.first(udp_payload_offset(p)); }
inline std::span<const uint8_t> udp_payload_of(const Packet& p) { return p.ip_packet.subspan(udp_payload_offset(p)); }

inline std::string packet_name(const testing::TestParamInfo<std::size_t>& info) {
  return std::string(kPackets[info.param].name);
}

inline std::vector<std::size_t> all_packet_indices() {
  std::vector<std::size_t> v(std::size(kPackets));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

}  // namespace softhca::wire::golden
