// softhca C++ API: memory registration with typed access flags.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "error.hpp"
#include "flags.hpp"
#include "handle.hpp"
#include "pd.hpp"

namespace softhca {

// ibv_access_flags as a type, so that an MR's access cannot be confused with
// a send flag or a plain int.
enum class Access : unsigned {
  None = 0,
  LocalWrite = IBV_ACCESS_LOCAL_WRITE,
  RemoteWrite = IBV_ACCESS_REMOTE_WRITE,
  RemoteRead = IBV_ACCESS_REMOTE_READ,
  RemoteAtomic = IBV_ACCESS_REMOTE_ATOMIC,
  MwBind = IBV_ACCESS_MW_BIND,
  ZeroBased = IBV_ACCESS_ZERO_BASED,
  OnDemand = IBV_ACCESS_ON_DEMAND,
  RelaxedOrdering = IBV_ACCESS_RELAXED_ORDERING,
};
template <>
struct EnableBitmask<Access> : std::true_type {};

constexpr int to_ibv(Access a) noexcept { return static_cast<int>(std::to_underlying(a)); }

namespace detail {
struct MrTraits {
  static constexpr const char* verb = "ibv_dereg_mr";
  static int destroy(ibv_mr* m) noexcept { return ibv_dereg_mr(m); }
};
}  // namespace detail

// A registered buffer. The memory is the caller's and must outlive the region.
class MemoryRegion : public detail::Handle<ibv_mr, detail::MrTraits> {
 public:
  using Handle::Handle;

  static Expected<MemoryRegion> create(const ProtectionDomain& pd, std::span<std::byte> buf,
                                       Access access) noexcept {
    errno = 0;
    auto m = detail::check_ptr(ibv_reg_mr(pd.get(), buf.data(), buf.size(), to_ibv(access)), "ibv_reg_mr");
    if (!m) return std::unexpected(m.error());
    return MemoryRegion(*m);
  }
  static MemoryRegion make(const ProtectionDomain& pd, std::span<std::byte> buf, Access access) {
    return value_or_throw(create(pd, buf, access));
  }

  std::uint32_t lkey() const noexcept { return get()->lkey; }
  std::uint32_t rkey() const noexcept { return get()->rkey; }
  std::uint64_t addr() const noexcept { return reinterpret_cast<std::uintptr_t>(get()->addr); }
  std::span<std::byte> span() const noexcept { return {static_cast<std::byte*>(get()->addr), get()->length}; }

  // A scatter/gather entry for [offset, offset + length) of the region; the
  // whole rest of it when length is omitted.
  ibv_sge sge(std::size_t offset = 0, std::size_t length = SIZE_MAX) const noexcept {
    std::size_t n = std::min(length, get()->length - offset);
    return ibv_sge{addr() + offset, static_cast<std::uint32_t>(n), lkey()};
  }
};

}  // namespace softhca
