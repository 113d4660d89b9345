// Event channels and events: creating and destroying a channel, handing out
// and acknowledging events (with what librdmacm does while handing one out:
// the new id of a CONNECT_REQUEST, the RTU of a CONNECT_RESPONSE, the attach
// of a MULTICAST_JOIN), moving an id to another channel, and the wait of a
// synchronous id (complete).
#include <fcntl.h>

#include <cstring>

#include "cm_handles.hpp"

namespace softhca::rdmacm {
namespace {

bool nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK) != 0;
}

}  // namespace

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

}  // extern "C"
