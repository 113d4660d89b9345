// Receive work queues (ibv_create_wq, ibv_modify_wq, ibv_destroy_wq,
// ibv_post_wq_recv) and receive work queue indirection tables
// (ibv_create_rwq_ind_table): what an RSS QP (ibv_create_qp_ex with
// IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE, qp.cpp) spreads its
// frames over. A work queue is an engine raw packet QP with a receive queue
// and no send queue; its states map onto the QP's (RESET, RDY = RTR, ERR).
#include <cerrno>
#include <new>

#include "engine/context.hpp"
#include "engine/qp/queue_pair.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {
namespace {

WqHandle* to_wq_handle(ibv_wq* wq) { return reinterpret_cast<WqHandle*>(wq); }

int wq_post_recv(ibv_wq* wq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (wq == nullptr) {
    *bad_wr = wr;
    return fail_with(EINVAL);
  }
  const int err = to_wq_handle(wq)->impl->post_recv(wr, bad_wr);
  return err == 0 ? 0 : fail_with(err);
}

// The largest table: 2^kMaxLogIndTable work queues (rss_caps in device_query.cpp).
constexpr uint32_t kMaxLogIndTable = 8;

}  // namespace

ibv_wq* create_wq_op(ibv_context* context, ibv_wq_init_attr* attr) {
  return pointer_verb([&]() -> ibv_wq* {
    engine::Context* ctx = to_context(context);
    if (ctx == nullptr || attr == nullptr || attr->wq_type != IBV_WQT_RQ || attr->pd == nullptr ||
        attr->cq == nullptr || attr->pd->context != context || attr->cq->context != context ||
        (attr->comp_mask & ~static_cast<uint32_t>(IBV_WQ_INIT_ATTR_FLAGS)) != 0) {
      errno = EINVAL;
      return nullptr;
    }
    // VLAN stripping, FCS scattering, padding, delay drop: none offered.
    if ((attr->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && attr->create_flags != 0) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    engine::QpInitAttr init{};
    init.type = IBV_QPT_RAW_PACKET;
    init.send_cq = init.recv_cq = to_cq(attr->cq);
    init.max_recv_wr = attr->max_wr;
    init.max_recv_sge = attr->max_sge;
    auto qp = engine::QueuePair::create(*ctx, to_pd(attr->pd), init);
    if (!qp) {
      errno = to_errno(qp.error());
      return nullptr;
    }
    auto* h = new (std::nothrow) WqHandle{};
    if (h == nullptr) {
      delete *qp;
      errno = ENOMEM;
      return nullptr;
    }
    h->impl = *qp;
    h->impl->handle = &h->wq;
    ibv_wq& w = h->wq;
    w.context = context;
    w.pd = attr->pd;
    w.cq = attr->cq;
    w.wq_num = h->impl->qpn();
    w.handle = h->impl->qpn();
    w.state = IBV_WQS_RESET;
    w.wq_type = IBV_WQT_RQ;
    w.post_recv = wq_post_recv;
    attr->max_wr = init.max_recv_wr;
    attr->max_sge = init.max_recv_sge;
    return &w;
  });
}

int modify_wq_op(ibv_wq* wq, ibv_wq_attr* attr) {
  return int_verb([&] {
    if (wq == nullptr || attr == nullptr) return EINVAL;
    constexpr uint32_t kKnown = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS;
    if ((attr->attr_mask & ~kKnown) != 0) return EINVAL;
    if ((attr->attr_mask & IBV_WQ_ATTR_FLAGS) && attr->flags_mask != 0) return EOPNOTSUPP;
    const ibv_wq_state current = wq->state;
    if ((attr->attr_mask & IBV_WQ_ATTR_CURR_STATE) && attr->curr_wq_state != current) return EINVAL;
    if (!(attr->attr_mask & IBV_WQ_ATTR_STATE)) return 0;
    engine::QueuePair& qp = *to_wq_handle(wq)->impl;
    ibv_qp_attr a{};
    switch (attr->wq_state) {
      case IBV_WQS_RDY:
        if (current == IBV_WQS_ERR) return EINVAL;  // back through RESET
        if (current == IBV_WQS_RESET) {
          a.qp_state = IBV_QPS_INIT;
          a.port_num = 1;
          if (auto ok = qp.modify(a, IBV_QP_STATE | IBV_QP_PORT); !ok) return to_errno(ok.error());
          a = ibv_qp_attr{};
          a.qp_state = IBV_QPS_RTR;
          if (auto ok = qp.modify(a, IBV_QP_STATE); !ok) return to_errno(ok.error());
        }
        break;
      case IBV_WQS_RESET:
      case IBV_WQS_ERR:
        a.qp_state = attr->wq_state == IBV_WQS_RESET ? IBV_QPS_RESET : IBV_QPS_ERR;
        if (auto ok = qp.modify(a, IBV_QP_STATE); !ok) return to_errno(ok.error());
        break;
      default:
        return EINVAL;
    }
    wq->state = attr->wq_state;
    return 0;
  });
}

int destroy_wq_op(ibv_wq* wq) {
  return int_verb([&] {
    if (wq == nullptr) return EINVAL;
    WqHandle* h = to_wq_handle(wq);
    if (h->tables.load() != 0) return EBUSY;  // an indirection table names it
    h->impl->context().forget_events(wq);
    h->impl->async_events.wait_all_acked();
    delete h->impl;
    pthread_mutex_destroy(&wq->mutex);
    pthread_cond_destroy(&wq->cond);
    delete h;
    return 0;
  });
}

ibv_rwq_ind_table* create_rwq_ind_table_op(ibv_context* context, ibv_rwq_ind_table_init_attr* attr) {
  return pointer_verb([&]() -> ibv_rwq_ind_table* {
    if (to_context(context) == nullptr || attr == nullptr || attr->comp_mask != 0 || attr->ind_tbl == nullptr ||
        attr->log_ind_tbl_size > kMaxLogIndTable) {
      errno = EINVAL;
      return nullptr;
    }
    const uint32_t n = 1u << attr->log_ind_tbl_size;
    for (uint32_t i = 0; i < n; ++i) {
      ibv_wq* wq = attr->ind_tbl[i];
      if (wq == nullptr || wq->context != context || wq->wq_type != IBV_WQT_RQ) {
        errno = EINVAL;
        return nullptr;
      }
    }
    auto* h = new IndTableHandle{};
    h->wqs.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      WqHandle* wq = to_wq_handle(attr->ind_tbl[i]);
      wq->tables.fetch_add(1);
      h->wqs.push_back(wq);
    }
    static std::atomic<int> next_table{1};
    h->table.context = context;
    h->table.ind_tbl_handle = h->table.ind_tbl_num = next_table.fetch_add(1);
    return &h->table;
  });
}

int destroy_rwq_ind_table_op(ibv_rwq_ind_table* table) {
  return int_verb([&] {
    if (table == nullptr) return EINVAL;
    auto* h = reinterpret_cast<IndTableHandle*>(table);
    if (h->qps.load() != 0) return EBUSY;  // an RSS QP uses it
    for (WqHandle* wq : h->wqs) wq->tables.fetch_sub(1);
    delete h;
    return 0;
  });
}

}  // namespace softhca::abi
