// The rdma_cm calls: event channels, ids, addressing, connection set-up and
// tear-down, events. Semantics and errno values follow rdma-core 44's
// librdmacm over the kernel's rdma_cm; the protocol itself runs in the CM
// service (src/cm).
#include <endian.h>
#include <fcntl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cm/mad_codec.hpp"
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
  rec.mtu = IBV_MTU_4096;
  rec.rate_selector = 2;
  rec.rate = IBV_RATE_100_GBPS;
  rec.packet_life_time_selector = 2;
  rec.packet_life_time = cm::kPacketLifeTime;  // what the CM's timeouts assume
}

ChannelHandle* new_channel(cm::Service* svc) {
  auto ch = svc->create_channel();
  if (!ch) {
    errno = static_cast<int>(ch.error());
    return nullptr;
  }
  auto* h = new ChannelHandle;
  h->impl = *ch;
  h->channel.fd = h->impl->fd();
  return h;
}

void free_channel(ChannelHandle* h) { delete h; }

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

bool nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK) != 0;
}

int valid_param(IdHandle* h, const rdma_conn_param* param) {
  if (h->id.ps != RDMA_PS_TCP) return 0;
  if (h->id.qp == nullptr && param == nullptr) return set_errno(EINVAL);
  if (param == nullptr) return 0;
  if (param->responder_resources != RDMA_MAX_RESP_RES &&
      param->responder_resources > cm::Service::max_responder_resources())
    return set_errno(EINVAL);
  if (param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > cm::Service::max_initiator_depth())
    return set_errno(EINVAL);
  return 0;
}

}  // namespace

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

int complete(IdHandle* h) {
  if (h->sync_channel == nullptr) return 0;
  if (h->id.event != nullptr) {
    rdma_ack_cm_event(h->id.event);
    h->id.event = nullptr;
  }
  if (rdma_get_cm_event(h->id.channel, &h->id.event) != 0) return -1;
  const rdma_cm_event* ev = h->id.event;
  if (ev->status == 0) return 0;
  if (ev->event == RDMA_CM_EVENT_REJECTED) return set_errno(ECONNREFUSED);
  return set_errno(ev->status < 0 ? -ev->status : ev->status);
}

int process_conn_resp(IdHandle* h) {
  int ret = modify_qp_rtr(h, RDMA_MAX_RESP_RES);
  if (ret == 0) ret = modify_qp_rts(h, RDMA_MAX_INIT_DEPTH);
  if (ret == 0) {
    if (auto r = service()->establish(h->impl); !r) ret = set_errno(r.error());
  }
  if (ret != 0) {
    const int err = errno;
    modify_qp_err(&h->id);
    errno = err;
  }
  return ret;
}

}  // namespace softhca::rdmacm

using namespace softhca;
using namespace softhca::rdmacm;

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
  try {
    cm::Service* svc = service();
    if (svc == nullptr) return nullptr;
    if (!device_present()) {
      errno = ENODEV;
      return nullptr;
    }
    ChannelHandle* h = new_channel(svc);
    return h == nullptr ? nullptr : &h->channel;
  } catch (...) {
    errno = ENOMEM;
    return nullptr;
  }
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel == nullptr) return;
  // Ids still on the channel go down with it, as the kernel destroys the ids
  // of a closed rdma_cm file: their peers are told and their ports freed.
  ChannelHandle* h = to_handle(channel);
  if (cm::Service* svc = service()) svc->close_channel(h->impl.get());
  free_channel(h);
}

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

int rdma_listen(rdma_cm_id* id, int backlog) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (auto r = service()->listen(h->impl, backlog); !r) return set_errno(r.error());
    sync_id(h);
    return 0;
  });
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (valid_param(h, conn_param) != 0) return -1;
    const uint8_t max_init = cm::Service::max_initiator_depth();
    const uint8_t max_resp = cm::Service::max_responder_resources();
    h->initiator_depth = conn_param != nullptr && conn_param->initiator_depth != RDMA_MAX_INIT_DEPTH
                             ? conn_param->initiator_depth
                             : max_init;
    h->responder_resources = conn_param != nullptr && conn_param->responder_resources != RDMA_MAX_RESP_RES
                                 ? conn_param->responder_resources
                                 : max_resp;
    cm::ConnectRequest req;
    req.qpn = conn_param != nullptr ? conn_param->qp_num : 0;
    req.srq = conn_param != nullptr && conn_param->srq != 0;
    if (id->qp != nullptr) {
      req.qpn = id->qp->qp_num;
      req.srq = id->qp->srq != nullptr;
    }
    req.responder_resources = h->responder_resources;
    req.initiator_depth = h->initiator_depth;
    req.retry_count = conn_param != nullptr ? conn_param->retry_count : 7;
    req.rnr_retry_count = conn_param != nullptr ? conn_param->rnr_retry_count : 7;
    req.flow_control = conn_param != nullptr && conn_param->flow_control != 0;
    std::vector<uint8_t> pdata = h->ep_connect_data;
    if (conn_param != nullptr && conn_param->private_data != nullptr && conn_param->private_data_len != 0) {
      const auto* p = static_cast<const uint8_t*>(conn_param->private_data);
      pdata.insert(pdata.end(), p, p + conn_param->private_data_len);
    }
    req.private_data = pdata;
    if (auto r = service()->connect(h->impl, req); !r) return set_errno(r.error());
    h->ep_connect_data.clear();
    return complete(h);
  });
}

int rdma_establish(rdma_cm_id* id) {
  if (id == nullptr) return set_errno(EINVAL);
  if (id->qp != nullptr) return set_errno(EINVAL);
  return cm_call([&] { return process_conn_resp(to_handle(id)); });
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (id == nullptr) return set_errno(EINVAL);
  if (id->qp == nullptr && conn_param == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (valid_param(h, conn_param) != 0) return -1;
    if (conn_param == nullptr || conn_param->initiator_depth == RDMA_MAX_INIT_DEPTH)
      h->initiator_depth = std::min(h->initiator_depth, cm::Service::max_initiator_depth());
    else
      h->initiator_depth = conn_param->initiator_depth;
    if (conn_param == nullptr || conn_param->responder_resources == RDMA_MAX_RESP_RES)
      h->responder_resources = std::min(h->responder_resources, cm::Service::max_responder_resources());
    else
      h->responder_resources = conn_param->responder_resources;

    const bool ud = id->qp_type == IBV_QPT_UD;
    if (!ud) {
      if (modify_qp_rtr(h, h->responder_resources) != 0) return -1;
      if (modify_qp_rts(h, h->initiator_depth) != 0) return -1;
    }
    cm::AcceptRequest req;
    req.qpn = id->qp != nullptr ? id->qp->qp_num : conn_param->qp_num;
    req.srq = id->qp != nullptr ? id->qp->srq != nullptr : conn_param->srq != 0;
    req.responder_resources = h->responder_resources;
    req.initiator_depth = h->initiator_depth;
    req.rnr_retry_count = conn_param != nullptr ? conn_param->rnr_retry_count : 7;
    req.flow_control = conn_param != nullptr && conn_param->flow_control != 0;
    if (conn_param != nullptr && conn_param->private_data != nullptr)
      req.private_data = std::span<const uint8_t>(static_cast<const uint8_t*>(conn_param->private_data),
                                                  conn_param->private_data_len);
    if (auto r = service()->accept(h->impl, req); !r) {
      modify_qp_err(id);
      return set_errno(r.error());
    }
    if (ud) return 0;
    return complete(h);
  });
}

static int reject_with_reason(rdma_cm_id* id, const void* private_data, uint8_t private_data_len, uint16_t reason) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    std::span<const uint8_t> pd;
    if (private_data != nullptr && private_data_len != 0)
      pd = std::span<const uint8_t>(static_cast<const uint8_t*>(private_data), private_data_len);
    if (auto r = service()->reject(to_handle(id)->impl, pd, reason); !r) return set_errno(r.error());
    return 0;
  });
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  // librdmacm passes reason 0, which the kernel turns into "consumer defined".
  return reject_with_reason(id, private_data, private_data_len,
                            static_cast<uint16_t>(cm::RejReason::kConsumerDefined));
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject_with_reason(id, private_data, private_data_len,
                            static_cast<uint16_t>(cm::RejReason::kVendorOptionNotSupported));
}

int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  if (id == nullptr) return set_errno(EINVAL);
  if (event != IBV_EVENT_COMM_EST) return set_errno(EINVAL);
  return cm_call([&] {
    if (auto r = service()->notify_established(to_handle(id)->impl); !r) return set_errno(r.error());
    return 0;
  });
}

int rdma_disconnect(rdma_cm_id* id) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (id->verbs == nullptr) return set_errno(EINVAL);
    if (modify_qp_err(id) != 0) return -1;
    auto r = service()->disconnect(h->impl);
    if (!r) return set_errno(r.error());
    if (!*r) return 0;  // nothing is coming: do not wait for it
    return complete(h);
  });
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (channel == nullptr || event == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    cm::Service* svc = service();
    if (svc == nullptr) return -1;
    std::shared_ptr<cm::Channel> ch = to_handle(channel)->impl;  // stays alive while we wait
    for (;;) {
      auto got = svc->get_event(ch.get(), nonblocking(ch->fd()));
      if (!got) return set_errno(got.error());
      cm::Event& ev = *got;
      auto* listener = ev.listen_id != nullptr ? static_cast<IdHandle*>(ev.listen_id->user()) : nullptr;
      auto* h = static_cast<IdHandle*>(svc->ensure_user(ev.id, [&]() -> void* {
        // An id created by a CONNECT_REQUEST: it starts on its listener's
        // channel with its listener's context.
        auto* child = new IdHandle;
        std::memset(&child->id, 0, sizeof child->id);
        child->impl = ev.id;
        if (listener != nullptr) {
          child->id.channel = listener->id.channel;
          child->id.context = listener->id.context;
          child->id.ps = listener->id.ps;
          child->id.qp_type = listener->id.qp_type;
        }
        return child;
      }));
      auto* eh = new EventHandle;
      std::memset(&eh->event, 0, sizeof eh->event);
      eh->counted = ev.counted;
      eh->event.id = &h->id;
      eh->event.listen_id = listener != nullptr ? &listener->id : nullptr;
      eh->event.event = static_cast<rdma_cm_event_type>(ev.out.type);
      eh->event.status = ev.out.status;
      std::memcpy(eh->private_data, ev.out.private_data.data(), ev.out.private_data_len);
      sync_id(h);
      rdma_conn_param& p = eh->event.param.conn;
      if (h->id.qp_type == IBV_QPT_UD) {
        // struct rdma_ud_param: the peer's address, QPN and Q_Key.
        rdma_ud_param& ud = eh->event.param.ud;
        ud.private_data = ev.out.private_data_len != 0 ? eh->private_data : nullptr;
        ud.private_data_len = ev.out.private_data_len;
        ud.ah_attr.is_global = 1;
        ud.ah_attr.port_num = h->id.port_num != 0 ? h->id.port_num : 1;
        ud.ah_attr.grh.dgid = h->id.route.addr.addr.ibaddr.dgid;
        ud.ah_attr.grh.sgid_index = svc->info(h->impl).sgid_index;
        ud.ah_attr.grh.hop_limit = 64;
        ud.qp_num = ev.out.param.qp_num;
        ud.qkey = ev.out.qkey;
      } else {
        p.private_data = ev.out.private_data_len != 0 ? eh->private_data : nullptr;
        p.private_data_len = ev.out.private_data_len;
        p.responder_resources = ev.out.param.responder_resources;
        p.initiator_depth = ev.out.param.initiator_depth;
        p.flow_control = ev.out.param.flow_control;
        p.retry_count = ev.out.param.retry_count;
        p.rnr_retry_count = ev.out.param.rnr_retry_count;
        p.srq = ev.out.param.srq;
        p.qp_num = ev.out.param.qp_num;
      }

      switch (eh->event.event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          if (h->id.qp_type != IBV_QPT_UD) {
            h->initiator_depth = p.initiator_depth;
            h->responder_resources = p.responder_resources;
          }
          if (listener != nullptr && listener->sync_channel != nullptr && h->sync_channel == nullptr) {
            // A synchronous listener's requests become synchronous ids.
            if (ChannelHandle* own = new_channel(svc)) {
              // Cannot fail: the id's channel is the one being read.
              (void)svc->migrate_id(h->impl, own->impl.get());
              h->sync_channel = own;
              h->id.channel = &own->channel;
            }
          }
          break;
        case RDMA_CM_EVENT_CONNECT_RESPONSE:
          if (h->id.qp != nullptr) {
            if (process_conn_resp(h) == 0) {
              eh->event.event = RDMA_CM_EVENT_ESTABLISHED;
            } else {
              eh->event.event = RDMA_CM_EVENT_CONNECT_ERROR;
              eh->event.status = -errno;
              h->connect_error = true;
            }
          }
          break;
        case RDMA_CM_EVENT_MULTICAST_JOIN:
          if (!process_join(h, eh->event, ev.out.mgid, ev.out.mc_context)) {
            eh->event.event = RDMA_CM_EVENT_MULTICAST_ERROR;
            eh->event.status = -errno;
          }
          break;
        case RDMA_CM_EVENT_REJECTED:
          if (h->connect_error) {
            rdma_ack_cm_event(&eh->event);
            continue;
          }
          modify_qp_err(&h->id);
          break;
        case RDMA_CM_EVENT_DISCONNECTED:
          if (h->connect_error) {
            rdma_ack_cm_event(&eh->event);
            continue;
          }
          break;
        default:
          break;
      }
      *event = &eh->event;
      return 0;
    }
  });
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (event == nullptr) return set_errno(EINVAL);
  EventHandle* eh = to_handle(event);
  if (cm::Service* svc = service()) svc->ack_event(eh->counted);
  delete eh;
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (h->sync_channel != nullptr && channel == nullptr) return set_errno(EINVAL);
    cm::Service* svc = service();
    ChannelHandle* fresh = nullptr;
    if (channel == nullptr) {
      fresh = new_channel(svc);
      if (fresh == nullptr) return -1;
      channel = &fresh->channel;
    }
    if (h->sync_channel != nullptr && h->id.event != nullptr) {
      rdma_ack_cm_event(h->id.event);
      h->id.event = nullptr;
    }
    if (auto r = svc->migrate_id(h->impl, to_handle(channel)->impl.get()); !r) {
      if (fresh != nullptr) free_channel(fresh);
      return set_errno(r.error());
    }
    if (h->sync_channel != nullptr) free_channel(h->sync_channel);
    h->sync_channel = fresh;
    h->id.channel = channel;
    return 0;
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

__be16 rdma_get_src_port(rdma_cm_id* id) {
  if (id == nullptr) return 0;
  const sockaddr* sa = &id->route.addr.src_addr;
  if (sa->sa_family == AF_INET) return id->route.addr.src_sin.sin_port;
  if (sa->sa_family == AF_INET6) return id->route.addr.src_sin6.sin6_port;
  return 0;
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
  if (id == nullptr) return 0;
  const sockaddr* sa = &id->route.addr.dst_addr;
  if (sa->sa_family == AF_INET) return id->route.addr.dst_sin.sin_port;
  if (sa->sa_family == AF_INET6) return id->route.addr.dst_sin6.sin6_port;
  return 0;
}

int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || id->qp != nullptr || ece == nullptr || ece->vendor_id == 0 || ece->comp_mask != 0)
    return set_errno(EINVAL);
  to_handle(id)->local_ece.vendor_id = ece->vendor_id;
  to_handle(id)->local_ece.options = ece->options;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || id->qp != nullptr || ece == nullptr) return set_errno(EINVAL);
  ece->vendor_id = to_handle(id)->remote_ece.vendor_id;
  ece->options = to_handle(id)->remote_ece.options;
  ece->comp_mask = 0;
  return 0;
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (listen == nullptr || id == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* lh = to_handle(listen);
    if (lh->sync_channel == nullptr) return set_errno(EINVAL);
    if (listen->event != nullptr) {
      rdma_ack_cm_event(listen->event);
      listen->event = nullptr;
    }
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(listen->channel, &event) != 0) return -1;
    int ret = 0;
    if (event->event == RDMA_CM_EVENT_REJECTED) {
      ret = set_errno(ECONNREFUSED);
    } else if (event->status != 0) {
      ret = set_errno(event->status < 0 ? -event->status : event->status);
    } else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      ret = set_errno(EINVAL);
    } else if (lh->ep_qp_init_attr) {
      ibv_qp_init_attr attr = *lh->ep_qp_init_attr;
      ret = rdma_create_qp(event->id, listen->pd, &attr);
    }
    if (ret != 0) {
      listen->event = event;
      return ret;
    }
    *id = event->id;
    (*id)->event = event;
    return 0;
  });
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || res == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    rdma_cm_id* cm_id = nullptr;
    if (create_id(nullptr, &cm_id, nullptr, static_cast<rdma_port_space>(res->ai_port_space),
                  static_cast<ibv_qp_type>(res->ai_qp_type)) != 0)
      return -1;
    IdHandle* h = to_handle(cm_id);
    int ret = 0;
    if (res->ai_flags & RAI_PASSIVE) {
      ret = rdma_bind_addr(cm_id, res->ai_src_addr);
      if (ret == 0) {
        if (pd != nullptr) cm_id->pd = pd;
        if (qp_init_attr != nullptr) {
          h->ep_qp_init_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
          h->ep_qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
        }
      }
    } else {
      ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
      if (ret == 0) ret = rdma_resolve_route(cm_id, 2000);
      if (ret == 0 && qp_init_attr != nullptr) {
        qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
        ret = rdma_create_qp(cm_id, pd, qp_init_attr);
      }
      if (ret == 0 && res->ai_connect_len != 0 && res->ai_connect != nullptr) {
        const auto* p = static_cast<const uint8_t*>(res->ai_connect);
        h->ep_connect_data.assign(p, p + res->ai_connect_len);
      }
    }
    if (ret != 0) {
      const int err = errno;
      rdma_destroy_ep(cm_id);
      errno = err;
      return -1;
    }
    *id = cm_id;
    return 0;
  });
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp != nullptr) rdma_destroy_qp(id);
  if (id->srq != nullptr) rdma_destroy_srq(id);
  to_handle(id)->ep_qp_init_attr.reset();
  rdma_destroy_id(id);
}

}  // extern "C"
