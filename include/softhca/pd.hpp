// softhca C++ API: protection domain.
#pragma once

#include <infiniband/verbs.h>

#include "device.hpp"
#include "error.hpp"
#include "handle.hpp"

namespace softhca {

namespace detail {
struct PdTraits {
  static constexpr const char* verb = "ibv_dealloc_pd";
  static int destroy(ibv_pd* p) noexcept { return ibv_dealloc_pd(p); }
};
}  // namespace detail

class ProtectionDomain : public detail::Handle<ibv_pd, detail::PdTraits> {
 public:
  using Handle::Handle;

  // Takes the raw context so that a PD can also be made on an rdma_cm id's
  // verbs context, which no Context owns.
  static Expected<ProtectionDomain> create(ibv_context* ctx) noexcept {
    errno = 0;
    auto p = detail::check_ptr(ibv_alloc_pd(ctx), "ibv_alloc_pd");
    if (!p) return std::unexpected(p.error());
    return ProtectionDomain(*p);
  }
  static Expected<ProtectionDomain> create(const Context& ctx) noexcept { return create(ctx.get()); }
  static ProtectionDomain make(ibv_context* ctx) { return value_or_throw(create(ctx)); }
  static ProtectionDomain make(const Context& ctx) { return value_or_throw(create(ctx)); }
};

}  // namespace softhca
