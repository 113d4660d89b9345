// softhca C++ API: address handle (the destination of a UD send).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "error.hpp"
#include "handle.hpp"
#include "pd.hpp"

namespace softhca {

namespace detail {
struct AhTraits {
  static constexpr const char* verb = "ibv_destroy_ah";
  static int destroy(ibv_ah* a) noexcept { return ibv_destroy_ah(a); }
};
}  // namespace detail

// The global route to `dgid`: on RoCE every address is a GID, so this is the
// attribute set both AHs and RC/UC paths are built from.
inline ibv_ah_attr global_route(const ibv_gid& dgid, std::uint8_t port = 1, std::uint8_t sgid_index = 0,
                                std::uint8_t hop_limit = 64, std::uint16_t dlid = 0) noexcept {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.grh.dgid = dgid;
  a.grh.sgid_index = sgid_index;
  a.grh.hop_limit = hop_limit;
  a.dlid = dlid;
  a.port_num = port;
  return a;
}

class AddressHandle : public detail::Handle<ibv_ah, detail::AhTraits> {
 public:
  using Handle::Handle;

  static Expected<AddressHandle> create(const ProtectionDomain& pd, const ibv_ah_attr& attr) noexcept {
    ibv_ah_attr a = attr;  // ibv_create_ah takes a non-const pointer
    errno = 0;
    auto h = detail::check_ptr(ibv_create_ah(pd.get(), &a), "ibv_create_ah");
    if (!h) return std::unexpected(h.error());
    return AddressHandle(*h);
  }
  static Expected<AddressHandle> create(const ProtectionDomain& pd, const ibv_gid& dgid, std::uint8_t port = 1,
                                        std::uint8_t sgid_index = 0) noexcept {
    return create(pd, global_route(dgid, port, sgid_index));
  }
  static AddressHandle make(const ProtectionDomain& pd, const ibv_ah_attr& attr) {
    return value_or_throw(create(pd, attr));
  }
  static AddressHandle make(const ProtectionDomain& pd, const ibv_gid& dgid, std::uint8_t port = 1,
                            std::uint8_t sgid_index = 0) {
    return value_or_throw(create(pd, dgid, port, sgid_index));
  }
};

}  // namespace softhca
