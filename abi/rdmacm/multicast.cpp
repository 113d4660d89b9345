// Multicast on UD rdma_cm ids, as librdmacm does it over a RoCE device: the
// join queues MULTICAST_JOIN (the service), whose param.ud describes the group
// (MGID = the IPv4-mapped or IPv6 group address, QPN 0xFFFFFF, RDMA_UDP_QKEY,
// as the kernel's cma_iboe_join_multicast sets them); handing that event out
// attaches the id's QP, and the leave detaches it. Delivery is the verbs
// library's: every QP attached on this host through shared memory, and other
// hosts' members through the group's IP address, which the attachment joins
// on the interface of the id's address (as the kernel's
// cma_iboe_join_multicast joins it on the id's netdev; ibv_attach_mcast,
// which names no interface, would join it on all of them).
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "cm_handles.hpp"
#include "engine/device/device_info.hpp"
#include "engine/node.hpp"

using namespace softhca;
using namespace softhca::rdmacm;

namespace {

constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// The group's MGID: the kernel's cma_iboe_set_mgid (IPv4: ::ffff:a.b.c.d; IPv6: the address).
// Only multicast addresses name a group: anything else could never be attached.
Result<cm::IpAddress> group_of(const sockaddr* addr) {
  auto ip = cm::from_sockaddr(addr);
  if (!ip) return ip;
  const cm::Gid& g = ip->addr;
  const bool multicast = ip->family == AF_INET ? (g[12] & 0xF0) == 0xE0 : g[0] == 0xff;
  if (!multicast) return fail(std::errc::invalid_argument);
  return ip;
}

// Attaches the id's QP to the group (0 or an errno): through libibverbs'
// node when it is softhca's, with the group joined on the network on the
// interface of the id's source address only (none for loopback).
int attach(IdHandle* h, const cm::Gid& mgid) {
  engine::Node* node = verbs_node();
  if (node == nullptr) {
    ibv_gid gid;
    std::memcpy(gid.raw, mgid.data(), 16);
    return ibv_attach_mcast(h->id.qp, &gid, 0);
  }
  const auto& device = engine::device_info();
  const engine::GidEntry* source = device.gid_at(service()->info(h->impl).sgid_index);
  const auto interfaces = source != nullptr ? engine::group_interfaces(device.gids, mgid.data(), source->ifindex)
                                            : std::vector<uint32_t>{};
  const auto r = node->attach_multicast(h->id.qp->qp_num, mgid.data(), interfaces);
  return r ? 0 : to_errno(r.error());
}

int detach(IdHandle* h, const cm::Gid& mgid) {
  if (engine::Node* node = verbs_node()) {
    const auto r = node->detach_multicast(h->id.qp->qp_num, mgid.data());
    return r ? 0 : to_errno(r.error());
  }
  ibv_gid gid;
  std::memcpy(gid.raw, mgid.data(), 16);
  return ibv_detach_mcast(h->id.qp, &gid, 0);
}

int join(rdma_cm_id* id, const sockaddr* addr, bool send_only, void* context) {
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    auto group = group_of(addr);
    if (!group) return set_errno(group.error());
    McJoin mc;
    std::memcpy(&mc.addr, addr, group->family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    mc.mgid = group->addr;
    mc.context = context;
    mc.send_only = send_only;
    h->multicast.push_back(mc);
    if (auto r = service()->join_multicast(h->impl, mc.mgid, context); !r) {
      h->multicast.pop_back();
      return set_errno(r.error());
    }
    return complete(h);
  });
}

}  // namespace

namespace softhca::rdmacm {

bool process_join(IdHandle* h, rdma_cm_event& event, const cm::Gid& mgid, void* context) {
  rdma_ud_param& ud = event.param.ud;
  std::memcpy(ud.ah_attr.grh.dgid.raw, mgid.data(), 16);
  ud.qp_num = kMulticastQpn;
  ud.private_data = context;  // librdmacm hands the join's context back here
  ud.private_data_len = 0;
  // A join left before its event came out attaches nothing.
  auto mc = std::find_if(h->multicast.begin(), h->multicast.end(),
                         [&](const McJoin& m) { return m.mgid == mgid && m.context == context && !m.attached; });
  if (mc == h->multicast.end() || mc->send_only || h->id.qp == nullptr) return true;
  if (int rc = attach(h, mgid); rc != 0) {
    errno = rc;
    return false;
  }
  mc->attached = true;
  return true;
}

}  // namespace softhca::rdmacm

extern "C" {

int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  if (id == nullptr || addr == nullptr) return set_errno(EINVAL);
  return join(id, addr, false, context);
}

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* context) {
  if (id == nullptr || mc_join_attr == nullptr) return set_errno(EINVAL);
  // librdmacm's checks: an address and join flags, nothing unknown.
  if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || mc_join_attr->addr == nullptr ||
      (mc_join_attr->comp_mask & ~(RDMA_CM_JOIN_MC_ATTR_RESERVED - 1)) != 0 ||
      !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      mc_join_attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return set_errno(EINVAL);
  return join(id, mc_join_attr->addr, mc_join_attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context);
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    auto group = cm::from_sockaddr(addr);
    if (!group) return set_errno(EADDRNOTAVAIL);
    auto mc = std::find_if(h->multicast.begin(), h->multicast.end(), [&](const McJoin& m) {
      auto joined = cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&m.addr));
      return joined && joined->family == group->family && joined->addr == group->addr;
    });
    if (mc == h->multicast.end()) return set_errno(EADDRNOTAVAIL);  // never joined
    if (mc->attached && h->id.qp != nullptr) {
      if (int rc = detach(h, mc->mgid); rc != 0) return set_errno(rc);
    }
    h->multicast.erase(mc);
    return 0;
  });
}

}  // extern "C"
