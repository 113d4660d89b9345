#include "engine/protection_domain.hpp"

#include "engine/context.hpp"

namespace softhca::engine {

Result<ProtectionDomain*> ProtectionDomain::create(Context& context) {
  Node& node = context.node();
  if (!node.pd_quota().try_take()) return fail(std::errc::not_enough_memory);
  auto* pd = new ProtectionDomain(context, node.registry().allocate_pd_id(), false);
  context.publish(pd, pd->id());  // for ibv_import_pd
  return pd;
}

ProtectionDomain* ProtectionDomain::adopt(Context& context, uint32_t id) {
  return new ProtectionDomain(context, id, true);
}

ProtectionDomain::~ProtectionDomain() {
  if (adopted_) return;  // the context keeps its adopted objects' books
  context_.withdraw(this, id_);
  context_.node().pd_quota().give_back();
}

}  // namespace softhca::engine
