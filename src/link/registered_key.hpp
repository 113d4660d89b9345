// The protection rules (transport/memory_key.hpp) judge a MemoryKey; the
// host registry records an MrRecord. This is the one translation between
// them, for every layer that looks a key up and then asks the rules.
#pragma once

#include "host/host_registry.hpp"
#include "transport/memory_key.hpp"

namespace softhca::link {

// `mr` as the rules see it. `host_addr` is where its iova maps for the
// caller, by default the owner's own address.
inline transport::MemoryKey registered_key(const host::MrRecord& mr, uint64_t host_addr) {
  return transport::MemoryKey{mr.key,    mr.pd_id,  mr.access,
                              mr.iova,   mr.length, host_addr,
                              static_cast<transport::KeyKind>(mr.kind), mr.qpn};
}
inline transport::MemoryKey registered_key(const host::MrRecord& mr) { return registered_key(mr, mr.host_addr); }

}  // namespace softhca::link
