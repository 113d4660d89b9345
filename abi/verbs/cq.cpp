// Completion queues and completion channels.
#include <cerrno>
#include <cstring>
#include <memory>

#include "engine/completion_channel.hpp"
#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "common/limits.hpp"
#include "ext_verbs.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace softhca::abi {

int poll_cq_op(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  engine::CompletionQueue* impl = to_cq(cq);
  if (impl == nullptr) return -1;
  return impl->poll(num_entries, wc);
}

int req_notify_cq_op(ibv_cq* cq, int solicited_only) {
  engine::CompletionQueue* impl = to_cq(cq);
  if (impl == nullptr) return fail_with(EINVAL);
  impl->arm(solicited_only != 0);
  return 0;
}

ibv_cq_ex* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                            int comp_vector, uint64_t wc_flags, uint32_t flags) {
  engine::Context* ctx = to_context(context);
  if (ctx == nullptr || comp_vector < 0 || comp_vector >= limits::kNumCompVectors) {
    errno = EINVAL;
    return nullptr;
  }
  auto h = std::make_unique<CqHandle>();  // before the engine CQ: nothing to undo if this throws
  auto cq = engine::CompletionQueue::create(*ctx, cqe, to_channel(channel),
                                            (wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                                         IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)) != 0);
  if (!cq) {
    errno = to_errno(cq.error());
    return nullptr;
  }
  h->impl = *cq;
  h->impl->handle = &h->cq;
  h->wc_flags = wc_flags;
  h->single_threaded = (flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED) != 0;
  ibv_cq_ex& c = h->cq;
  c.context = context;
  c.channel = channel;
  c.cq_context = cq_context;
  c.cqe = h->impl->cqe();  // what was granted (queue_sizes.hpp)
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  install_cq_poll_ops(*h);
  return &h.release()->cq;
}

}  // namespace softhca::abi

extern "C" {

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  return pointer_verb([&]() -> ibv_comp_channel* {
    if (to_context(context) == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto channel = engine::CompletionChannel::create();
    if (!channel) {
      errno = to_errno(channel.error());
      return nullptr;
    }
    auto* h = new ChannelHandle{};
    h->impl = *channel;
    h->channel.context = context;
    h->channel.fd = (*channel)->fd();
    h->channel.refcnt = 0;
    return &h->channel;
  });
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  return int_verb([&] {
    engine::CompletionChannel* impl = to_channel(channel);
    if (impl == nullptr) return EINVAL;
    if (impl->in_use()) return EBUSY;
    delete impl;
    delete reinterpret_cast<ChannelHandle*>(channel);
    return 0;
  });
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  return pointer_verb([&]() -> ibv_cq* {
    ibv_cq_ex* cq = create_cq_common(context, cqe, cq_context, channel, comp_vector, IBV_WC_STANDARD_FLAGS, 0);
    return cq != nullptr ? ibv_cq_ex_to_cq(cq) : nullptr;
  });
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  return int_verb([&] {
    engine::CompletionQueue* impl = to_cq(cq);
    if (impl == nullptr) return EINVAL;
    if (auto ok = impl->resize(cqe); !ok) return to_errno(ok.error());
    cq->cqe = impl->cqe();
    return 0;
  });
}

int ibv_destroy_cq(ibv_cq* cq) {
  return int_verb([&] {
    engine::CompletionQueue* impl = to_cq(cq);
    if (impl == nullptr) return EINVAL;
    if (impl->in_use()) return EBUSY;
    // As rdma-core does: wait until every event given out was acknowledged.
    impl->context().forget_events(cq);
    impl->comp_events.wait_all_acked();
    impl->async_events.wait_all_acked();
    delete impl;
    pthread_mutex_destroy(&cq->mutex);
    pthread_cond_destroy(&cq->cond);
    delete reinterpret_cast<CqHandle*>(cq);
    return 0;
  });
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  engine::CompletionChannel* impl = to_channel(channel);
  if (impl == nullptr || cq == nullptr || cq_context == nullptr) {
    errno = EINVAL;
    return -1;
  }
  auto got = impl->get_event();
  if (!got) {
    errno = to_errno(got.error());
    return -1;
  }
  (*got)->comp_events.reported();
  auto* handle = static_cast<ibv_cq*>((*got)->handle);
  *cq = handle;
  *cq_context = handle->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (engine::CompletionQueue* impl = to_cq(cq)) impl->comp_events.acked(nevents);
}

}  // extern "C"
