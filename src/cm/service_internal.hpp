// What the files of the CM service (service*.cpp) share and nobody else
// sees: small helpers of the service's own, not part of its interface.
#pragma once

#include <cstdint>
#include <random>

#include "cm/mad_codec.hpp"
#include "cm/transport.hpp"

namespace softhca::cm::detail {

inline constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY

// The process's random source (comm ID seed, starting PSNs).
std::mt19937& rng();
uint32_t random_psn();
// The GID at `index` of softhca0's table (zero when there is none).
Gid gid_at(uint32_t index);
// The path MTU (enum ibv_mtu) through the interface of GID `index`: the
// largest whose RoCEv2 packets fit that interface, as the kernel's
// iboe_get_mtu derives a RoCE path's MTU from its netdev (4096 if unknown).
uint8_t path_mtu_at(uint32_t index);

// The key of a passive id in Service::passive_by_peer_.
inline uint64_t peer_key(const Peer& peer, uint32_t remote_comm_id) {
  return (uint64_t{peer.pid} << 32) | remote_comm_id;
}

}  // namespace softhca::cm::detail
