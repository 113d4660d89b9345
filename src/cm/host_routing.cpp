#include "cm/host_routing.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <type_traits>

namespace softhca::cm {
namespace {

// "RMAD": an envelope, not a bare MAD (whose first byte is the base version 1).
constexpr uint8_t kRelayTag[4] = {'R', 'M', 'A', 'D'};

// The listener key a request names: its service ID's port space and port,
// and the destination address of its rdma_cm IP header.
std::optional<BindKey> listener_of(uint64_t service_id, std::span<const uint8_t> private_data) {
  if (!is_ip_service_id(service_id) || private_data.size() < kIpHeaderSize) return std::nullopt;
  const auto hdr = decode_ip_header(private_data.first<kIpHeaderSize>());
  if (!hdr) return std::nullopt;
  BindKey key;
  key.ps = service_id_ps(service_id);
  key.port = service_id_port(service_id);
  key.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  key.addr = hdr->dst;
  return key;
}

}  // namespace

MadRoute route_of(const Mad& mad) {
  MadRoute route;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ReqMsg> || std::is_same_v<T, SidrReqMsg>) {
          if (auto key = listener_of(m.service_id, m.private_data)) {
            route.by = MadRoute::By::kListener;
            route.listener = *key;
          }
        } else {
          uint32_t ours = 0;
          if constexpr (std::is_same_v<T, SidrRepMsg>)
            ours = m.request_id;
          else
            ours = m.remote_comm_id;
          if (comm_id_owner(ours) != 0) {
            route.by = MadRoute::By::kCommId;
            route.comm_id = ours;
          }
        }
      },
      mad.msg);
  return route;
}

std::vector<uint8_t> encode_relayed(const RelayedMad& relayed) {
  std::vector<uint8_t> out(kRelayedMadSize);
  std::memcpy(out.data(), kRelayTag, 4);
  std::memcpy(out.data() + 4, relayed.remote.data(), 16);
  std::memcpy(out.data() + 20, relayed.local.data(), 16);
  std::memcpy(out.data() + 36, relayed.mad.data(), kMadSize);
  return out;
}

std::optional<RelayedMad> decode_relayed(std::span<const uint8_t> bytes) {
  if (bytes.size() != kRelayedMadSize || std::memcmp(bytes.data(), kRelayTag, 4) != 0) return std::nullopt;
  RelayedMad r;
  std::memcpy(r.remote.data(), bytes.data() + 4, 16);
  std::memcpy(r.local.data(), bytes.data() + 20, 16);
  std::memcpy(r.mad.data(), bytes.data() + 36, kMadSize);
  return r;
}

}  // namespace softhca::cm
