// The rdma_cm calls on an id itself: creating and destroying it, binding,
// address and route resolution, options, rdma_init_qp_attr, and the public
// fields of rdma_cm_id kept in step with the service (sync_id). Semantics and
// errno values follow rdma-core 44's librdmacm over the kernel's rdma_cm.
#include <endian.h>

#include <cstdlib>
#include <cstring>

#include "cm_handles.hpp"

namespace softhca::rdmacm {
namespace {

socklen_t addr_len(const sockaddr* addr) {
  if (addr == nullptr) return 0;
  switch (addr->sa_family) {
    case AF_INET: return sizeof(sockaddr_in);
    case AF_INET6: return sizeof(sockaddr_in6);
    case AF_IB: return sizeof(sockaddr_ib);
    default: return 0;
  }
}

// The port of an address an id holds (network order), 0 for a family
// without one (AF_IB, or none yet).
__be16 port_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(sa)->sin_port;
  if (sa->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port;
  return 0;
}

void fill_path_record(const cm::IdInfo& info, ibv_sa_path_rec& rec) {
  std::memset(&rec, 0, sizeof rec);
  std::memcpy(rec.dgid.raw, info.dgid.data(), 16);
  std::memcpy(rec.sgid.raw, info.sgid.data(), 16);
  rec.hop_limit = 64;
  rec.traffic_class = info.traffic_class;
  rec.reversible = 1;
  rec.numb_path = 1;
  rec.pkey = htobe16(info.pkey);
  rec.mtu_selector = 2;
  rec.mtu = static_cast<ibv_mtu>(info.path_mtu);
  rec.rate_selector = 2;
  rec.rate = IBV_RATE_100_GBPS;
  rec.packet_life_time_selector = 2;
  rec.packet_life_time = cm::kPacketLifeTime;  // what the CM's timeouts assume
}

}  // namespace

int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  if (out == nullptr) return set_errno(EINVAL);
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_UDP:
    case RDMA_PS_IB:
    case RDMA_PS_IPOIB:
      break;
    default:
      return set_errno(EINVAL);
  }
  cm::Service* svc = service();
  if (svc == nullptr) return -1;
  auto* h = new IdHandle;
  std::memset(&h->id, 0, sizeof h->id);
  h->id.context = context;
  h->id.ps = ps;
  h->id.qp_type = qp_type;
  if (channel == nullptr) {
    h->sync_channel = new_channel(svc);
    if (h->sync_channel == nullptr) {
      delete h;
      return -1;
    }
    channel = &h->sync_channel->channel;
  }
  h->id.channel = channel;
  auto impl = svc->create_id(to_handle(channel)->impl.get(), static_cast<uint16_t>(ps), qp_type, h);
  if (!impl) {
    if (h->sync_channel != nullptr) free_channel(h->sync_channel);
    delete h;
    return set_errno(impl.error());
  }
  h->impl = *impl;
  *out = &h->id;
  return 0;
}

void sync_id(IdHandle* h) {
  cm::Service* svc = service();
  if (svc == nullptr) return;
  const cm::IdInfo info = svc->info(h->impl);
  rdma_cm_id& id = h->id;
  sockaddr_storage ss;
  if (info.src.family != 0 && cm::to_sockaddr(info.src, ss) != 0) std::memcpy(&id.route.addr.src_storage, &ss, sizeof ss);
  if (info.dst.family != 0 && cm::to_sockaddr(info.dst, ss) != 0) std::memcpy(&id.route.addr.dst_storage, &ss, sizeof ss);
  if (info.has_device) {
    if (!h->device_ref) {
      if (ibv_pd* pd = device_pd_acquire()) {
        h->device_ref = true;
        id.verbs = device_context();
        if (id.pd == nullptr) id.pd = pd;
      }
    }
    id.port_num = info.port_num;
    std::memcpy(id.route.addr.addr.ibaddr.sgid.raw, info.sgid.data(), 16);
    std::memcpy(id.route.addr.addr.ibaddr.dgid.raw, info.dgid.data(), 16);
    id.route.addr.addr.ibaddr.pkey = htobe16(info.pkey);
  }
  if (info.route_resolved && id.route.path_rec == nullptr) {
    auto* rec = static_cast<ibv_sa_path_rec*>(std::calloc(1, sizeof(ibv_sa_path_rec)));
    if (rec != nullptr) {
      fill_path_record(info, *rec);
      id.route.path_rec = rec;
      id.route.num_paths = 1;
    }
  }
}

}  // namespace softhca::rdmacm

using namespace softhca;
using namespace softhca::rdmacm;

extern "C" {

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  const ibv_qp_type qp_type = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
  return cm_call([&] { return create_id(channel, id, context, ps, qp_type); });
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (h->id.event != nullptr) {
      rdma_ack_cm_event(h->id.event);
      h->id.event = nullptr;
    }
    auto destroyed = service()->destroy_id(h->impl);
    if (h->device_ref) device_pd_release();
    std::free(h->id.route.path_rec);
    if (h->sync_channel != nullptr) free_channel(h->sync_channel);
    delete h;
    // EBADF: its channel was destroyed first (the id went down with it).
    return destroyed ? 0 : set_errno(destroyed.error());
  });
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr_len(addr) == 0) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    auto ip = cm::from_sockaddr(addr);
    if (!ip) return set_errno(ip.error());
    if (auto r = service()->bind(h->impl, *ip); !r) return set_errno(r.error());
    sync_id(h);
    return 0;
  });
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  if (id == nullptr || addr_len(dst_addr) == 0) return set_errno(EINVAL);
  if (src_addr != nullptr && addr_len(src_addr) == 0) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    auto dst = cm::from_sockaddr(dst_addr);
    if (!dst) return set_errno(dst.error());
    std::optional<cm::IpAddress> src;
    if (src_addr != nullptr) {
      auto s = cm::from_sockaddr(src_addr);
      if (!s) return set_errno(s.error());
      src = *s;
    }
    std::memcpy(&id->route.addr.dst_storage, dst_addr, addr_len(dst_addr));
    if (auto r = service()->resolve_addr(h->impl, src, *dst, timeout_ms); !r) return set_errno(r.error());
    sync_id(h);
    return complete(h);
  });
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (auto r = service()->resolve_route(h->impl, timeout_ms); !r) return set_errno(r.error());
    sync_id(h);
    return complete(h);
  });
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (id == nullptr) return set_errno(EINVAL);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
      case RDMA_OPTION_ID_ACK_TIMEOUT: {
        if (optlen != sizeof(uint8_t) || optval == nullptr) return set_errno(EINVAL);
        const uint8_t value = *static_cast<const uint8_t*>(optval);
        return cm_call([&] {
          IdHandle* h = to_handle(id);
          auto r = optname == RDMA_OPTION_ID_TOS ? service()->set_tos(h->impl, value)
                                                 : service()->set_ack_timeout(h->impl, value);
          return r ? 0 : set_errno(r.error());
        });
      }
      case RDMA_OPTION_ID_REUSEADDR:
      case RDMA_OPTION_ID_AFONLY:
        return optlen == sizeof(int) && optval != nullptr ? 0 : set_errno(EINVAL);
      default:
        return set_errno(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB) {
    if (optname != RDMA_OPTION_IB_PATH) return set_errno(ENOSYS);
    return optval != nullptr && optlen != 0 && optlen % sizeof(ibv_path_data) == 0 ? 0 : set_errno(EINVAL);
  }
  return set_errno(ENOSYS);
}

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (id == nullptr || qp_attr == nullptr || qp_attr_mask == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    auto plan = service()->init_qp_attr(to_handle(id)->impl, qp_attr->qp_state);
    if (!plan) return set_errno(plan.error());
    *qp_attr = plan->attr;
    *qp_attr_mask = plan->mask;
    return 0;
  });
}

__be16 rdma_get_src_port(rdma_cm_id* id) { return id == nullptr ? 0 : port_of(&id->route.addr.src_addr); }

__be16 rdma_get_dst_port(rdma_cm_id* id) { return id == nullptr ? 0 : port_of(&id->route.addr.dst_addr); }

}  // extern "C"
