// Endpoints, librdmacm's convenience layer over the calls above:
// rdma_create_ep (an id set up from rdma_getaddrinfo's answer, with its QP),
// rdma_destroy_ep, and rdma_get_request (a synchronous listener's next
// connection, with the endpoint's QP created on it).
#include <memory>

#include "cm_handles.hpp"

using namespace softhca;
using namespace softhca::rdmacm;

extern "C" {

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
