// UD multicast: ibv_attach_mcast / ibv_detach_mcast. Group membership is
// host-wide (the host registry's group table), so a send to a group reaches
// every attached QP in every softhca process of the host and nothing else.
// The checks are the kernel's (ib_attach_mcast, ib_uverbs_attach_mcast):
// only UD QPs, only multicast GIDs; attaching twice is a no-op returning 0;
// detaching a group the QP is not in is EINVAL. The port is RoCE, so the LID
// is ignored, as is_valid_mcast_lid() does for Ethernet ports.
#include <cerrno>
#include <cstring>

#include "common/limits.hpp"
#include "engine/node.hpp"
#include "engine/qp/queue_pair.hpp"
#include "handles.hpp"

using namespace softhca;
using namespace softhca::abi;

static_assert(limits::kMaxMcastGrp == host::kMaxMcastGroups);
static_assert(limits::kMaxMcastQpAttach == host::kMaxMcastMembers);

namespace {

// rdma_is_multicast_addr(): an IPv6 multicast address, or IPv4-mapped 224.0.0.0/4.
bool is_multicast(const ibv_gid& gid) {
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (gid.raw[0] == 0xff) return true;
  return std::memcmp(gid.raw, kMappedPrefix, 12) == 0 && (gid.raw[12] & 0xF0) == 0xE0;
}

engine::QueuePair* checked_ud_qp(ibv_qp* qp, const ibv_gid* gid) {
  engine::QueuePair* impl = to_qp(qp);
  if (impl == nullptr || gid == nullptr || impl->type() != IBV_QPT_UD || !is_multicast(*gid)) return nullptr;
  return impl;
}

}  // namespace

extern "C" {

int ibv_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t /*lid*/) {
  return int_verb([&] {
    engine::QueuePair* impl = checked_ud_qp(qp, gid);
    if (impl == nullptr) return EINVAL;
    if (auto ok = impl->attach_multicast(gid->raw); !ok) return to_errno(ok.error());
    return 0;
  });
}

int ibv_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t /*lid*/) {
  return int_verb([&] {
    engine::QueuePair* impl = checked_ud_qp(qp, gid);
    if (impl == nullptr) return EINVAL;
    if (auto ok = impl->detach_multicast(gid->raw); !ok) return to_errno(ok.error());
    return 0;
  });
}

}  // extern "C"
