// A flow steering rule attached to a raw packet QP (ibv_create_flow): while
// it exists, the frames on the port's virtual Ethernet segment that its rule
// matches reach the QP (transport/flow_steering.hpp says which). The rule is
// handed to the shm link, which carries frames between the processes of the
// host (host/raw_flows holds every process's flows).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "common/result.hpp"
#include "transport/flow_steering.hpp"

namespace softhca::engine {

class QueuePair;

// RSS QPs: the hash key length and the fields softhca hashes on.
inline constexpr std::size_t kRxHashKeyBytes = transport::kRxHashKeyBytes;
inline constexpr uint64_t kRxHashFields = transport::kRxHashFields;

class Flow {
 public:
  // EINVAL for a malformed rule or one on a port other than 1, EOPNOTSUPP
  // for what softhca does not steer on (parse_flow_rule) and for QPs other
  // than raw packet ones.
  static Result<Flow*> create(QueuePair& qp, const ibv_flow_attr& attr);
  // Detaches the rule: no frame reaches the QP through it any more.
  ~Flow();

  QueuePair& qp() { return qp_; }
  const transport::FlowRule& rule() const { return rule_; }

  Flow(const Flow&) = delete;
  Flow& operator=(const Flow&) = delete;

 private:
  Flow(QueuePair& qp, const transport::FlowRule& rule, uint64_t id) : qp_(qp), rule_(rule), id_(id) {}

  QueuePair& qp_;
  transport::FlowRule rule_;
  uint64_t id_;
};

}  // namespace softhca::engine
