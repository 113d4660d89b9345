// A protection domain: an id that is unique on the host, so a responder can
// check that an rkey's MR and its QP belong to the same PD.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/result.hpp"
#include "engine/user_count.hpp"

namespace softhca::engine {

class Context;

class ProtectionDomain : public UserCount {
 public:
  // A new PD with a host-unique id; not_enough_memory at max_pd.
  static Result<ProtectionDomain*> create(Context& context);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  Context& context() { return context_; }
  uint32_t id() const { return id_; }

 private:
  ProtectionDomain(Context& context, uint32_t id) : context_(context), id_(id) {}

  Context& context_;
  uint32_t id_;
};

}  // namespace softhca::engine
