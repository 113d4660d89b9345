// Which packets from the network a QP listens to at all, before its PSN,
// keys or state mean anything: the checks the kernel's Soft-RoCE makes on
// every packet it receives (rxe_recv.c, check_keys and check_addr), so that
// a host on the same Ethernet that is not a connection's peer cannot write,
// read or break it by guessing its QPN and PSN.
//
//  - P_Key: the BTH's partition key must match the QP's P_Key table entry
//    by IBTA's rule (C9-42): the same 15-bit partition, not the invalid one,
//    and at least one of the two a full member. softhca's table has one
//    entry, the default 0xFFFF, so every partition but the default one is
//    dropped, whatever the QP type (UD and QP1 included, as rxe does).
//  - Address: a connected QP (RC, UC, XRC INI or TGT) takes a packet only
//    when its IP source is the peer's address (the QP's AV's GID) and its
//    IP destination is the QP's own (the AV's source GID), both as RoCEv2
//    GIDs (IPv4 written ::ffff:a.b.c.d). UD and QP1 take datagrams from
//    anyone: their check is the Q_Key.
//
// A packet that fails either is dropped silently and counted before any
// state of the QP changes: it acknowledges nothing, is kept for nothing and
// marks nothing (the responder's out-of-order keeping and selective
// recovery only ever see packets that passed).
#pragma once

#include <cstdint>
#include <cstring>

#include "wire/ip_udp.hpp"

namespace softhca::transport {

// The one entry of softhca's P_Key table (ibv_query_pkey index 0).
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint16_t kPkeyFullMember = 0x8000;
inline constexpr uint16_t kPkeyPartition = 0x7FFF;

// IBTA's P_Key match: same partition, not the invalid partition 0, and a
// full member on at least one side (two limited members may not talk).
constexpr bool pkey_matches(uint16_t packet, uint16_t entry) {
  const uint16_t partition = packet & kPkeyPartition;
  return partition != 0 && partition == (entry & kPkeyPartition) && ((packet | entry) & kPkeyFullMember) != 0;
}

// Whether a packet that came from `src` to `dst` belongs to the connection
// between `own` (this QP's source GID) and `peer` (its destination GID).
inline bool from_peer(const wire::Gid& src, const wire::Gid& dst, const uint8_t (&own)[16],
                      const uint8_t (&peer)[16]) {
  return std::memcmp(src.data(), peer, 16) == 0 && std::memcmp(dst.data(), own, 16) == 0;
}

}  // namespace softhca::transport
