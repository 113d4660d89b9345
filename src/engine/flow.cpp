// Flow steering rules of raw packet QPs.
#include "engine/flow.hpp"

#include <atomic>

#include "common/log.hpp"
#include "engine/node.hpp"
#include "engine/qp/queue_pair.hpp"

namespace softhca::engine {

Result<Flow*> Flow::create(QueuePair& qp, const ibv_flow_attr& attr) {
  // Verbs also steers to UD QPs (IPoIB-style); softhca's segment carries
  // Ethernet frames to raw packet QPs only.
  if (qp.type() != IBV_QPT_RAW_PACKET) return fail(std::errc::operation_not_supported);
  auto rule = transport::parse_flow_rule(attr);
  if (!rule) {
    SOFTHCA_DEBUG("create_flow on qp 0x%x rejected (type %u, %u specs)", qp.qpn(), static_cast<unsigned>(transport::flow_attr_type(attr)),
                  static_cast<unsigned>(attr.num_of_specs));
    return fail(rule.error());
  }
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  if (auto ok = qp.node().shm_link().attach_flow(id, qp.flow_target(), *rule); !ok) return fail(ok.error());
  auto* flow = new Flow(qp, *rule, id);
  qp.flows.attach();
  return flow;
}

Flow::~Flow() {
  qp_.node().shm_link().detach_flow(id_);
  qp_.flows.detach();
}

}  // namespace softhca::engine
