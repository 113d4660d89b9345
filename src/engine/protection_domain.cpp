#include "engine/protection_domain.hpp"

#include "engine/context.hpp"

namespace softhca::engine {

Result<ProtectionDomain*> ProtectionDomain::create(Context& context) {
  Node& node = context.node();
  if (!node.pd_quota().try_take()) return fail(std::errc::not_enough_memory);
  return new ProtectionDomain(context, node.registry().allocate_pd_id());
}

ProtectionDomain::~ProtectionDomain() { context_.node().pd_quota().give_back(); }

}  // namespace softhca::engine
