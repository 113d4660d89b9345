// A protection domain: an id that is unique on the host, so a responder can
// check that an rkey's MR and its QP belong to the same PD.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/result.hpp"

namespace softhca::engine {

class Context;

class ProtectionDomain {
 public:
  // A new PD with a host-unique id; not_enough_memory at max_pd.
  static Result<ProtectionDomain*> create(Context& context);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  Context& context() { return context_; }
  uint32_t id() const { return id_; }
  // Objects that must be destroyed before the PD (EBUSY otherwise).
  void attach() { users_.fetch_add(1, std::memory_order_relaxed); }
  void detach() { users_.fetch_sub(1, std::memory_order_relaxed); }
  bool in_use() const { return users_.load(std::memory_order_relaxed) != 0; }

 private:
  ProtectionDomain(Context& context, uint32_t id) : context_(context), id_(id) {}

  Context& context_;
  uint32_t id_;
  std::atomic<uint32_t> users_{0};
};

}  // namespace softhca::engine
