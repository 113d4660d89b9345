// Queue pairs: create (legacy and extended), modify, query, destroy, post.
#include <cerrno>
#include <cstring>

#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "engine/flow.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "ext_verbs.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace {

// `pd` is nullptr (and `context` given) only for an XRC_RECV QP, which has `xrcd` instead.
// rss_table and hash: an RSS QP (create_qp_ex_op checked both).
ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr, bool block_self_multicast = false,
                  ibv_context* context = nullptr, ibv_xrcd* xrcd = nullptr, IndTableHandle* rss_table = nullptr,
                  const ibv_rx_hash_conf* hash = nullptr) {
  engine::ProtectionDomain* impl_pd = to_pd(pd);
  if (context == nullptr && pd != nullptr) context = pd->context;
  engine::Context* impl_context = to_context(context);
  if ((impl_pd == nullptr && xrcd == nullptr) || impl_context == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  engine::QpInitAttr init{};
  init.xrcd = to_xrcd(xrcd);
  init.type = attr->qp_type;
  init.send_cq = to_cq(attr->send_cq);
  init.recv_cq = to_cq(attr->recv_cq);
  init.srq = to_srq(attr->srq);
  init.max_send_wr = attr->cap.max_send_wr;
  init.max_recv_wr = attr->cap.max_recv_wr;
  init.max_send_sge = attr->cap.max_send_sge;
  init.max_recv_sge = attr->cap.max_recv_sge;
  init.max_inline_data = attr->cap.max_inline_data;
  init.sq_sig_all = attr->sq_sig_all != 0;
  init.block_self_multicast = block_self_multicast;
  if (rss_table != nullptr && hash != nullptr) {
    for (const WqHandle* wq : rss_table->wqs) init.rss_spread.push_back(wq->impl->qpn());
    init.rx_hash.fields = hash->rx_hash_fields_mask;
    std::memcpy(init.rx_hash.key.data(), hash->rx_hash_key, init.rx_hash.key.size());
  }
  auto qp = engine::QueuePair::create(*impl_context, impl_pd, init);
  if (!qp) {
    errno = to_errno(qp.error());
    return nullptr;
  }
  ibv_qp& q = *adopt_qp(*qp, context, attr->qp_context);
  auto* h = reinterpret_cast<QpHandle*>(&q);
  if (!init.rss_spread.empty()) {
    h->rss_table = rss_table;
    rss_table->qps.fetch_add(1);
  }
  q.pd = init.type == IBV_QPT_XRC_RECV ? nullptr : pd;
  q.send_cq = init.send_cq ? attr->send_cq : nullptr;
  q.recv_cq = init.recv_cq ? attr->recv_cq : nullptr;
  q.srq = init.srq ? attr->srq : nullptr;
  attr->cap.max_send_wr = init.max_send_wr;
  attr->cap.max_recv_wr = init.max_recv_wr;
  attr->cap.max_send_sge = init.max_send_sge;
  attr->cap.max_recv_sge = init.max_recv_sge;
  attr->cap.max_inline_data = init.max_inline_data;
  return &q;
}

}  // namespace

namespace softhca::abi {

ibv_qp* adopt_qp(engine::QueuePair* impl, ibv_context* context, void* qp_context) {
  auto* h = new QpHandle{};
  h->impl = impl;
  impl->handle = &h->qp.qp_base;
  ibv_qp& q = h->qp.qp_base;
  q.context = context;
  q.qp_context = qp_context;
  q.handle = impl->qpn();
  q.qp_num = impl->qpn();
  q.state = impl->state();  // RESET when new; an opened TGT QP may be further on
  q.qp_type = impl->type();
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return &q;
}

// ibv_post_send / ibv_post_recv: 0, or an errno with *bad_wr naming the first
// work request not posted (and errno set, as for every int verb).
int post_send_op(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  engine::QueuePair* impl = to_qp(qp);
  if (impl == nullptr) {
    *bad_wr = wr;
    return fail_with(EINVAL);
  }
  const int err = impl->post_send(wr, bad_wr);
  return err == 0 ? 0 : fail_with(err);
}

int post_recv_op(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  engine::QueuePair* impl = to_qp(qp);
  if (impl == nullptr) {
    *bad_wr = wr;
    return fail_with(EINVAL);
  }
  const int err = impl->post_recv(wr, bad_wr);
  return err == 0 ? 0 : fail_with(err);
}

ibv_qp* create_qp_ex_op(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  return pointer_verb([&]() -> ibv_qp* {
    // An XRC_RECV (TGT) QP has an XRC domain instead of a PD; every other type a PD.
    const bool xrc_recv = attr != nullptr && attr->qp_type == IBV_QPT_XRC_RECV;
    if (attr == nullptr || !(attr->comp_mask & (xrc_recv ? IBV_QP_INIT_ATTR_XRCD : IBV_QP_INIT_ATTR_PD))) {
      errno = EINVAL;
      return nullptr;
    }
    // The new post-send API (SEND_OPS_FLAGS), XRC domains and, as
    // create_flags, only BLOCK_SELF_MCAST_LB on UD QPs (mckey -l) are
    // offered; RSS, TSO, ... are not.
    constexpr uint32_t kSupported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                                    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_RX_HASH |
                                    IBV_QP_INIT_ATTR_IND_TABLE;
    const bool send_ops = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
    const uint32_t create_flags = (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? attr->create_flags : 0;
    const uint32_t allowed_flags = attr->qp_type == IBV_QPT_UD ? IBV_QP_CREATE_BLOCK_SELF_MCAST_LB : 0;
    if ((attr->comp_mask & ~kSupported) != 0 || (create_flags & ~allowed_flags) != 0 ||
        (send_ops && check_send_ops_flags(attr->qp_type, attr->send_ops_flags) != 0)) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    // RSS: a raw packet QP that spreads its flows' frames over an
    // indirection table's work queues by a Toeplitz hash (both masks).
    constexpr uint32_t kRss = IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
    const bool rss = (attr->comp_mask & kRss) != 0;
    if (rss) {
      const ibv_rx_hash_conf& hash = attr->rx_hash_conf;
      if ((attr->comp_mask & kRss) != kRss || attr->qp_type != IBV_QPT_RAW_PACKET || attr->rwq_ind_tbl == nullptr ||
          attr->rwq_ind_tbl->context != context || hash.rx_hash_key_len != engine::kRxHashKeyBytes ||
          hash.rx_hash_key == nullptr || send_ops) {
        errno = EINVAL;
        return nullptr;
      }
      if (hash.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || (hash.rx_hash_fields_mask & ~engine::kRxHashFields) != 0) {
        errno = EOPNOTSUPP;
        return nullptr;
      }
    }
    ibv_pd* pd = xrc_recv ? nullptr : attr->pd;
    ibv_xrcd* xrcd = xrc_recv ? attr->xrcd : nullptr;
    if (xrc_recv ? (xrcd == nullptr || xrcd->context != context) : (pd == nullptr || pd->context != context)) {
      errno = EINVAL;
      return nullptr;
    }
    ibv_qp_init_attr legacy{};
    legacy.qp_context = attr->qp_context;
    legacy.send_cq = attr->send_cq;
    legacy.recv_cq = attr->recv_cq;
    legacy.srq = attr->srq;
    legacy.cap = attr->cap;
    legacy.qp_type = attr->qp_type;
    legacy.sq_sig_all = attr->sq_sig_all;
    ibv_qp* qp = create_qp(pd, &legacy, (create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) != 0, context, xrcd,
                           rss ? reinterpret_cast<IndTableHandle*>(attr->rwq_ind_tbl) : nullptr,
                           rss ? &attr->rx_hash_conf : nullptr);
    if (qp == nullptr) return nullptr;
    attr->cap = legacy.cap;
    if (send_ops) {
      try {
        enable_qp_ex(*reinterpret_cast<QpHandle*>(qp), attr->send_ops_flags, legacy.cap);
      } catch (...) {
        ibv_destroy_qp(qp);
        throw;
      }
    }
    return qp;
  });
}

}  // namespace softhca::abi

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  return pointer_verb([&] { return create_qp(pd, attr); });
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  return int_verb([&] {
    engine::QueuePair* impl = to_qp(qp);
    if (impl == nullptr || attr == nullptr) return EINVAL;
    if (auto ok = impl->modify(*attr, attr_mask); !ok) return to_errno(ok.error());
    if (attr_mask & IBV_QP_STATE) qp->state = attr->qp_state;
    return 0;
  });
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  return int_verb([&] {
    (void)attr_mask;  // like hardware providers, we fill everything
    engine::QueuePair* impl = to_qp(qp);
    if (impl == nullptr || attr == nullptr || init_attr == nullptr) return EINVAL;
    impl->query(*attr, *init_attr);
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    qp->state = attr->qp_state;
    return 0;
  });
}

int ibv_destroy_qp(ibv_qp* qp) {
  return int_verb([&] {
    engine::QueuePair* impl = to_qp(qp);
    if (impl == nullptr) return EINVAL;
    // Flows steering to it go first (the kernel's QP use count).
    if (impl->flows.in_use()) return EBUSY;
    impl->context().forget_events(qp);
    impl->async_events.wait_all_acked();
    delete impl;
    if (IndTableHandle* table = reinterpret_cast<QpHandle*>(qp)->rss_table) table->qps.fetch_sub(1);
    pthread_mutex_destroy(&qp->mutex);
    pthread_cond_destroy(&qp->cond);
    delete reinterpret_cast<QpHandle*>(qp);
    return 0;
  });
}

int ibv_query_qp_data_in_order(ibv_qp* qp, ibv_wr_opcode op, uint32_t flags) {
  (void)op;
  (void)flags;
  // rdma-core 44: 1 when the QP writes a message's data in order. The shm
  // transport places every byte, in order, before it posts the completion.
  return to_qp(qp) != nullptr ? 1 : 0;
}

}  // extern "C"
