// softhca C++ API: shared receive queue.
//
// One pool of receives that several QPs draw from (name it in QpConfig::srq,
// or in ibv_qp_init_attr::srq for a QP made by rdma_cm): a server with many
// connections posts buffers once instead of per QP, sized for its total
// traffic rather than for the worst case of each peer.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "error.hpp"
#include "handle.hpp"
#include "pd.hpp"

namespace softhca {

namespace detail {
struct SrqTraits {
  static constexpr const char* verb = "ibv_destroy_srq";
  static int destroy(ibv_srq* s) noexcept { return ibv_destroy_srq(s); }
};
}  // namespace detail

class SharedReceiveQueue : public detail::Handle<ibv_srq, detail::SrqTraits> {
 public:
  using Handle::Handle;

  // max_wr receives of up to max_sge entries each. limit > 0 arms the limit
  // event at once (IBV_EVENT_SRQ_LIMIT_REACHED when fewer remain posted).
  static Expected<SharedReceiveQueue> create(const ProtectionDomain& pd, std::uint32_t max_wr,
                                             std::uint32_t max_sge = 1, std::uint32_t limit = 0,
                                             void* srq_context = nullptr) noexcept {
    ibv_srq_init_attr a{};
    a.srq_context = srq_context;
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    a.attr.srq_limit = limit;
    errno = 0;
    auto s = detail::check_ptr(ibv_create_srq(pd.get(), &a), "ibv_create_srq");
    if (!s) return std::unexpected(s.error());
    return SharedReceiveQueue(*s);
  }
  static SharedReceiveQueue make(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge = 1,
                                 std::uint32_t limit = 0, void* srq_context = nullptr) {
    return value_or_throw(create(pd, max_wr, max_sge, limit, srq_context));
  }

  // What the device granted (max_wr and max_sge may exceed the request) and
  // the limit now armed (0 once the limit event has fired).
  Expected<ibv_srq_attr> query() const noexcept {
    ibv_srq_attr a{};
    errno = 0;
    if (auto r = detail::check_rc(ibv_query_srq(get(), &a), "ibv_query_srq"); !r) return std::unexpected(r.error());
    return a;
  }
  // Arms the limit event again (it fires once per arming).
  Expected<void> arm_limit(std::uint32_t limit) const noexcept {
    ibv_srq_attr a{};
    a.srq_limit = limit;
    errno = 0;
    return detail::check_rc(ibv_modify_srq(get(), &a, IBV_SRQ_LIMIT), "ibv_modify_srq");
  }

  // The raw post; on failure `bad_wr` (when given) names the first request
  // not posted.
  Expected<void> post_recv(ibv_recv_wr& wr, ibv_recv_wr** bad_wr = nullptr) const noexcept {
    ibv_recv_wr* bad = nullptr;
    errno = 0;
    auto r = detail::check_rc(ibv_post_srq_recv(get(), &wr, &bad), "ibv_post_srq_recv");
    if (bad_wr) *bad_wr = bad;
    return r;
  }
  // One receive; the sges are only read during the call.
  Expected<void> recv(std::span<const ibv_sge> sges, std::uint64_t wr_id) const noexcept {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = const_cast<ibv_sge*>(sges.data());  // never written through; see QueuePair
    wr.num_sge = static_cast<int>(sges.size());
    return post_recv(wr);
  }
};

}  // namespace softhca
