// Shared receive queues.
#include <cerrno>

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

extern "C" {

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return pointer_verb([&]() -> ibv_srq* {
    engine::ProtectionDomain* impl_pd = to_pd(pd);
    if (impl_pd == nullptr || attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto srq = engine::SharedReceiveQueue::create(*impl_pd, attr->attr.max_wr, attr->attr.max_sge,
                                                  attr->attr.srq_limit);
    if (!srq) {
      errno = to_errno(srq.error());
      return nullptr;
    }
    attr->attr.max_wr = (*srq)->max_wr();  // what was granted (queue_sizes.hpp)
    auto* h = new SrqHandle{};
    h->impl = *srq;
    h->impl->handle = &h->srq;
    h->srq.context = pd->context;
    h->srq.srq_context = attr->srq_context;
    h->srq.pd = pd;
    pthread_mutex_init(&h->srq.mutex, nullptr);
    pthread_cond_init(&h->srq.cond, nullptr);
    return &h->srq;
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
