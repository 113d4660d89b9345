// Shared receive queues.
#include <cerrno>
#include <cstring>

#include "engine/context.hpp"
#include "engine/protection_domain.hpp"
#include "engine/shared_receive_queue.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace softhca::abi {

int post_srq_recv_op(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  engine::SharedReceiveQueue* impl = to_srq(srq);
  if (impl == nullptr) {
    *bad_wr = wr;
    return fail_with(EINVAL);
  }
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || (wr->num_sge > 0 && wr->sg_list == nullptr)) {
      *bad_wr = wr;
      return fail_with(EINVAL);
    }
    auto ok = impl->post(wr->wr_id, reinterpret_cast<const host::RecvSge*>(wr->sg_list),
                         static_cast<uint32_t>(wr->num_sge));
    if (!ok) {
      *bad_wr = wr;
      return fail_with(to_errno(ok.error()));
    }
  }
  return 0;
}

}  // namespace softhca::abi

namespace {

// A basic SRQ, or an XRC one (`xrc` names its domain and CQ); `attr.max_wr`
// becomes what was granted (queue_sizes.hpp).
ibv_srq* create_srq(ibv_pd* pd, void* srq_context, ibv_srq_attr& attr, engine::XrcSrqInit xrc,
                    engine::TmSrqInit tm = {}) {
  auto srq = engine::SharedReceiveQueue::create(*to_pd(pd), attr.max_wr, attr.max_sge, attr.srq_limit, xrc, tm);
  if (!srq) {
    errno = to_errno(srq.error());
    return nullptr;
  }
  attr.max_wr = (*srq)->max_wr();
  auto* h = new SrqHandle{};
  h->impl = *srq;
  h->impl->handle = &h->srq;
  h->srq.context = pd->context;
  h->srq.srq_context = srq_context;
  h->srq.pd = pd;
  pthread_mutex_init(&h->srq.mutex, nullptr);
  pthread_cond_init(&h->srq.cond, nullptr);
  return &h->srq;
}

}  // namespace

namespace softhca::abi {

// ibv_create_srq_ex: a basic SRQ (as ibv_create_srq) or an XRC SRQ, which
// needs its XRC domain and the CQ its receive completions go to.
ibv_srq* create_srq_ex_op(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  return pointer_verb([&]() -> ibv_srq* {
    if (attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                                IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    const ibv_srq_type type = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
    // Anything newer than basic, XRC and tag matching SRQs is not offered.
    if ((attr->comp_mask & ~kKnown) != 0 || (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM)) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    ibv_pd* pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : nullptr;
    if (to_pd(pd) == nullptr || pd->context != context) {
      errno = EINVAL;
      return nullptr;
    }
    engine::XrcSrqInit xrc;
    if (type == IBV_SRQT_XRC) {
      ibv_xrcd* xrcd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) ? attr->xrcd : nullptr;
      ibv_cq* cq = (attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ? attr->cq : nullptr;
      xrc.xrcd = to_xrcd(xrcd);
      xrc.cq = to_cq(cq);
      if (xrc.xrcd == nullptr || xrc.cq == nullptr) {
        errno = EINVAL;
        return nullptr;
      }
    }
    engine::TmSrqInit tm;
    if (type == IBV_SRQT_TM) {
      // Its list operations complete on its CQ; tm_cap sizes the list.
      ibv_cq* cq = (attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ? attr->cq : nullptr;
      tm.cq = to_cq(cq);
      if (tm.cq == nullptr || cq->context != context || (attr->comp_mask & IBV_SRQ_INIT_ATTR_TM) == 0) {
        errno = EINVAL;
        return nullptr;
      }
      tm.max_num_tags = attr->tm_cap.max_num_tags;
      tm.max_ops = attr->tm_cap.max_ops;
    }
    return create_srq(pd, attr->srq_context, attr->attr, xrc, tm);
  });
}

// ibv_post_srq_ops: tag list operations of a tag matching SRQ, in order; at
// most tm_cap.max_ops of them per call (ENOMEM at the first beyond, which
// *bad_op names, as at every other failure).
int post_srq_ops_op(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad_op) {
  engine::SharedReceiveQueue* impl = to_srq(srq);
  ibv_ops_wr* dummy = nullptr;
  if (bad_op == nullptr) bad_op = &dummy;
  if (impl == nullptr) {
    *bad_op = op;
    return EINVAL;
  }
  if (impl->tag_list() == nullptr) {
    *bad_op = op;
    return EOPNOTSUPP;
  }
  try {
    uint32_t count = 0;
    for (; op != nullptr; op = op->next) {
      if (++count > impl->max_ops()) {
        *bad_op = op;
        return ENOMEM;
      }
      engine::TagOp t;
      t.wr_id = op->wr_id;
      // Read as a number: an application may pass any value, and one outside
      // the enum's range is not a valid ibv_ops_wr_opcode to load.
      static_assert(sizeof op->opcode == sizeof t.opcode);
      std::memcpy(&t.opcode, &op->opcode, sizeof t.opcode);
      t.flags = static_cast<uint32_t>(op->flags);
      t.unexpected_cnt = op->tm.unexpected_cnt;
      t.handle = op->tm.handle;
      if (t.opcode == IBV_WR_TAG_ADD) {
        if (op->tm.add.num_sge < 0 || (op->tm.add.num_sge > 0 && op->tm.add.sg_list == nullptr)) {
          *bad_op = op;
          return EINVAL;
        }
        t.recv_wr_id = op->tm.add.recv_wr_id;
        t.sges = reinterpret_cast<const host::RecvSge*>(op->tm.add.sg_list);
        t.num_sge = static_cast<uint32_t>(op->tm.add.num_sge);
        t.tag = op->tm.add.tag;
        t.mask = op->tm.add.mask;
      }
      auto ok = impl->post_tag_op(t);
      if (!ok) {
        *bad_op = op;
        return to_errno(ok.error());
      }
      if (t.opcode == IBV_WR_TAG_ADD) op->tm.handle = t.handle;
    }
  } catch (...) {
    *bad_op = op;
    return ENOMEM;
  }
  return 0;
}

int get_srq_num_op(ibv_srq* srq, uint32_t* srq_num) {
  return int_verb([&] {
    engine::SharedReceiveQueue* impl = to_srq(srq);
    if (impl == nullptr || srq_num == nullptr || impl->srq_num() == 0) return EINVAL;  // only XRC SRQs have one
    *srq_num = impl->srq_num();
    return 0;
  });
}

}  // namespace softhca::abi

extern "C" {

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return pointer_verb([&]() -> ibv_srq* {
    if (to_pd(pd) == nullptr || attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    return create_srq(pd, attr->srq_context, attr->attr, {});
  });
}

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  return int_verb([&] {
    engine::SharedReceiveQueue* impl = to_srq(srq);
    if (impl == nullptr || attr == nullptr) return EINVAL;
    auto ok = impl->modify(attr->max_wr, attr->srq_limit, mask);
    return ok ? 0 : to_errno(ok.error());
  });
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  return int_verb([&] {
    engine::SharedReceiveQueue* impl = to_srq(srq);
    if (impl == nullptr || attr == nullptr) return EINVAL;
    impl->query(attr->max_wr, attr->max_sge, attr->srq_limit);
    return 0;
  });
}

int ibv_destroy_srq(ibv_srq* srq) {
  return int_verb([&] {
    engine::SharedReceiveQueue* impl = to_srq(srq);
    if (impl == nullptr) return EINVAL;
    if (impl->in_use()) return EBUSY;
    impl->pd().context().forget_events(srq);
    impl->async_events.wait_all_acked();
    delete impl;
    pthread_mutex_destroy(&srq->mutex);
    pthread_cond_destroy(&srq->cond);
    delete reinterpret_cast<SrqHandle*>(srq);
    return 0;
  });
}

}  // extern "C"
