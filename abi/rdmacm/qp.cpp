// QPs and SRQs on rdma_cm ids, and the state moves librdmacm makes on them,
// all through the public verbs API: the attributes come from the CM
// (rdma_init_qp_attr), the calls are plain ibv_modify_qp.
#include <chrono>
#include <cstring>
#include <thread>

#include "cm_handles.hpp"

namespace softhca::rdmacm {
namespace {

// How long rdma_disconnect lets the sends already on the wire finish.
constexpr std::chrono::milliseconds kDisconnectDrain{200};

int modify_from_cm(IdHandle* h, ibv_qp_state state, ibv_qp_attr& attr, int& mask) {
  attr.qp_state = state;
  return rdma_init_qp_attr(&h->id, &attr, &mask);
}

int create_cqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
  if (recv_size != 0) {
    id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
    if (id->recv_cq_channel == nullptr) goto err;
    id->recv_cq = ibv_create_cq(id->verbs, static_cast<int>(recv_size), id, id->recv_cq_channel, 0);
    if (id->recv_cq == nullptr) goto err;
  }
  if (send_size != 0) {
    id->send_cq_channel = ibv_create_comp_channel(id->verbs);
    if (id->send_cq_channel == nullptr) goto err;
    id->send_cq = ibv_create_cq(id->verbs, static_cast<int>(send_size), id, id->send_cq_channel, 0);
    if (id->send_cq == nullptr) goto err;
  }
  return 0;
err:
  {
    const int err = errno;
    destroy_cqs(id);
    errno = err;
  }
  return -1;
}

// INIT (UD: through RTS) right after creation, as librdmacm does.
int init_new_qp(IdHandle* h, ibv_qp* qp) {
  ibv_qp_attr attr{};
  int mask = 0;
  if (modify_from_cm(h, IBV_QPS_INIT, attr, mask) != 0) return -1;
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) return set_errno(rc);
  if (h->id.qp_type != IBV_QPT_UD) return 0;
  attr = {};
  attr.qp_state = IBV_QPS_RTR;
  if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE); rc != 0) return set_errno(rc);
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = 0;
  if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN); rc != 0) return set_errno(rc);
  return 0;
}

}  // namespace

void destroy_cqs(rdma_cm_id* id) {
  if (id->qp_type == IBV_QPT_XRC_RECV && id->srq != nullptr) return;
  if (id->recv_cq != nullptr) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq != nullptr && id->send_cq != id->recv_cq) {
      ibv_destroy_cq(id->send_cq);
      id->send_cq = nullptr;
    }
    id->recv_cq = nullptr;
  }
  if (id->recv_cq_channel != nullptr) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel != nullptr && id->send_cq_channel != id->recv_cq_channel) {
      ibv_destroy_comp_channel(id->send_cq_channel);
      id->send_cq_channel = nullptr;
    }
    id->recv_cq_channel = nullptr;
  }
  // A send CQ alone (no receive side) is still ours.
  if (id->send_cq != nullptr) {
    ibv_destroy_cq(id->send_cq);
    id->send_cq = nullptr;
  }
  if (id->send_cq_channel != nullptr) {
    ibv_destroy_comp_channel(id->send_cq_channel);
    id->send_cq_channel = nullptr;
  }
}

int modify_qp_rtr(IdHandle* h, uint8_t resp_res) {
  ibv_qp* qp = h->id.qp;
  if (qp == nullptr) return 0;
  ibv_qp_attr attr{};
  int mask = 0;
  // The INIT attributes first: the connection now decides the access flags.
  if (modify_from_cm(h, IBV_QPS_INIT, attr, mask) != 0) return -1;
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) return set_errno(rc);
  attr = {};
  if (modify_from_cm(h, IBV_QPS_RTR, attr, mask) != 0) return -1;
  if (resp_res != RDMA_MAX_RESP_RES) attr.max_dest_rd_atomic = resp_res;
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) return set_errno(rc);
  return 0;
}

int modify_qp_rts(IdHandle* h, uint8_t init_depth) {
  ibv_qp* qp = h->id.qp;
  if (qp == nullptr) return 0;
  ibv_qp_attr attr{};
  int mask = 0;
  if (modify_from_cm(h, IBV_QPS_RTS, attr, mask) != 0) return -1;
  if (init_depth != RDMA_MAX_INIT_DEPTH) attr.max_rd_atomic = init_depth;
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) return set_errno(rc);
  return 0;
}

void drain_send_queue(rdma_cm_id* id) {
  if (id->qp == nullptr || (id->qp->qp_type != IBV_QPT_RC && id->qp->qp_type != IBV_QPT_XRC_SEND)) return;
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init) != 0 || attr.qp_state != IBV_QPS_RTS) return;
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_SQD;
  if (ibv_modify_qp(id->qp, &attr, IBV_QP_STATE) != 0) return;
  const auto until = std::chrono::steady_clock::now() + kDisconnectDrain;
  for (;;) {
    if (ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init) != 0 || attr.sq_draining == 0) return;
    if (std::chrono::steady_clock::now() >= until) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int modify_qp_err(rdma_cm_id* id) {
  if (id->qp == nullptr) return 0;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(id->qp, &attr, IBV_QP_STATE); rc != 0) return set_errno(rc);
  return 0;
}

}  // namespace softhca::rdmacm

using namespace softhca::rdmacm;

extern "C" {

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) return set_errno(EINVAL);
  return cm_call([&] {
    IdHandle* h = to_handle(id);
    if (id->qp != nullptr || id->verbs == nullptr) return set_errno(EINVAL);
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr) {
      attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
      attr->pd = id->pd;
    } else if (id->verbs != attr->pd->context) {
      return set_errno(EINVAL);
    }
    if ((id->recv_cq != nullptr && attr->recv_cq != nullptr && id->recv_cq != attr->recv_cq) ||
        (id->send_cq != nullptr && attr->send_cq != nullptr && id->send_cq != attr->send_cq))
      return set_errno(EINVAL);
    if (id->qp_type == IBV_QPT_XRC_RECV) {
      // A TGT QP: the library's XRC domain unless the caller names one; no
      // CQs (its SRQ has the CQ, rdma_create_srq makes it).
      if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || attr->xrcd == nullptr) {
        attr->xrcd = device_xrcd();
        if (attr->xrcd == nullptr) return -1;
        attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
      }
      attr->qp_type = IBV_QPT_XRC_RECV;
      ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
      if (qp == nullptr) return -1;
      if (init_new_qp(h, qp) != 0) {
        const int err = errno;
        ibv_destroy_qp(qp);
        return set_errno(err);
      }
      id->qp = qp;
      return 0;
    }
    // An INI QP sends only.
    if (id->qp_type == IBV_QPT_XRC_SEND) attr->cap.max_recv_wr = 0;

    if (create_cqs(id, attr->send_cq != nullptr || id->send_cq != nullptr ? 0 : attr->cap.max_send_wr,
                   attr->recv_cq != nullptr || id->recv_cq != nullptr ? 0 : attr->cap.max_recv_wr) != 0)
      return -1;
    if (attr->send_cq == nullptr) attr->send_cq = id->send_cq;
    if (attr->recv_cq == nullptr) attr->recv_cq = id->recv_cq;
    if (id->srq != nullptr && attr->srq == nullptr) attr->srq = id->srq;

    ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
    if (qp == nullptr) {
      const int err = errno;
      destroy_cqs(id);
      return set_errno(err);
    }
    if (init_new_qp(h, qp) != 0) {
      const int err = errno;
      ibv_destroy_qp(qp);
      destroy_cqs(id);
      return set_errno(err);
    }
    id->pd = qp->pd;
    id->qp = qp;
    return 0;
  });
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || qp_init_attr == nullptr) return set_errno(EINVAL);
  ibv_qp_init_attr_ex attr_ex{};
  std::memcpy(&attr_ex, qp_init_attr, sizeof *qp_init_attr);
  attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  attr_ex.pd = pd != nullptr ? pd : id->pd;
  const int ret = rdma_create_qp_ex(id, &attr_ex);
  std::memcpy(qp_init_attr, &attr_ex, sizeof *qp_init_attr);
  return ret;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp != nullptr) ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  destroy_cqs(id);
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) return set_errno(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return set_errno(EINVAL);
  if (id->verbs == nullptr) return set_errno(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->pd = id->pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  if (attr->srq_type == IBV_SRQT_XRC) {
    // The id's XRC domain and a receive CQ of its own unless the caller gives them.
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || attr->xrcd == nullptr) {
      attr->xrcd = device_xrcd();
      if (attr->xrcd == nullptr) return -1;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || attr->cq == nullptr) {
      if (id->recv_cq == nullptr && create_cqs(id, 0, attr->attr.max_wr) != 0) return -1;
      attr->cq = id->recv_cq;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
    }
  }
  ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
  if (srq == nullptr) return -1;
  if (id->pd == nullptr) id->pd = attr->pd;
  id->srq = srq;
  return 0;
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (id == nullptr || attr == nullptr) return set_errno(EINVAL);
  ibv_srq_init_attr_ex attr_ex{};
  std::memcpy(&attr_ex, attr, sizeof *attr);
  attr_ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  attr_ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  attr_ex.pd = pd;
  const int ret = rdma_create_srq_ex(id, &attr_ex);
  std::memcpy(attr, &attr_ex, sizeof *attr);
  return ret;
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->srq != nullptr) ibv_destroy_srq(id->srq);
  id->srq = nullptr;
  destroy_cqs(id);
}

}  // extern "C"
