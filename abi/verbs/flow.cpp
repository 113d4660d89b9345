// ibv_create_flow / ibv_destroy_flow (verbs_context slots, reached through
// the inline verbs): flow steering rules of raw packet QPs (engine/flow.hpp).
#include <cerrno>

#include "engine/flow.hpp"
#include "engine/qp/queue_pair.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {

ibv_flow* create_flow_op(ibv_qp* qp, ibv_flow_attr* flow_attr) {
  return pointer_verb([&]() -> ibv_flow* {
    engine::QueuePair* impl = to_qp(qp);
    if (impl == nullptr || flow_attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto flow = engine::Flow::create(*impl, *flow_attr);
    if (!flow) {
      errno = to_errno(flow.error());
      return nullptr;
    }
    auto* h = new (std::nothrow) FlowHandle{};
    if (h == nullptr) {
      delete *flow;
      errno = ENOMEM;
      return nullptr;
    }
    h->impl = *flow;
    h->flow.context = qp->context;
    return &h->flow;
  });
}

int destroy_flow_op(ibv_flow* flow) {
  return int_verb([&] {
    engine::Flow* impl = to_flow(flow);
    if (impl == nullptr) return EINVAL;
    delete impl;
    delete reinterpret_cast<FlowHandle*>(flow);
    return 0;
  });
}

}  // namespace softhca::abi
