// Connection set-up and tear-down: rdma_listen, rdma_connect, rdma_accept,
// rdma_reject, the RTU (rdma_establish), rdma_notify, rdma_disconnect and
// the ECE values. The shim defaults rdma_conn_param as librdmacm does and
// moves the QP through RTR and RTS itself; the protocol runs in the service.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cm/mad_codec.hpp"
#include "cm_handles.hpp"

namespace softhca::rdmacm {
namespace {

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
    drain_send_queue(id);
    if (modify_qp_err(id) != 0) return -1;
    auto r = service()->disconnect(h->impl);
    if (!r) return set_errno(r.error());
    if (!*r) return 0;  // nothing is coming: do not wait for it
    return complete(h);
  });
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

}  // extern "C"
