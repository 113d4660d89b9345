// A memory window (verbs manual 2.3.5, IBTA 10.6.7): a key that grants
// remote access to a part of a memory region, bound and invalidated through
// the send queue. Its key lives in the host registry's MR table, describing
// the part of the MR it grants with its own access rights, so that an rkey
// resolves alike, on either link, whether it names an MR or a window.
//
// Type 1: bound by ibv_bind_mw (a bind WR on the QP's send queue), any QP of
// its PD may use it, unbound by a bind of length 0, never invalidated by
// LOCAL_INV or SEND_WITH_INV. Type 2: bound by IBV_WR_BIND_MW with a key byte
// of the consumer's choice, usable by the one QP it was bound through only,
// invalidated by LOCAL_INV or by a peer's SEND_WITH_INV, rebound only once
// invalid. A window is bound to an MR of its own PD registered with
// IBV_ACCESS_MW_BIND; the MR cannot be deregistered while a window is bound.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

#include "common/result.hpp"
#include "host/host_registry.hpp"

namespace softhca::engine {

class ProtectionDomain;

// One bind (IBV_WR_BIND_MW) as the send queue keeps it.
struct BindRequest {
  uint32_t new_key = 0;   // its low byte becomes the window's key byte
  uint32_t mr_lkey = 0;   // 0 with length 0 (unbind)
  uint64_t addr = 0;      // where in the MR (its iova space) the window starts
  uint64_t length = 0;    // 0: unbind (type 1 only)
  uint32_t access = 0;    // IBV_ACCESS_REMOTE_* | IBV_ACCESS_ZERO_BASED
};

// The semantic checks of a bind (IBTA C10-72..75, o10-36.2.2, o10-37.2.30,
// o10-37.2.40; rxe's rxe_check_bind_mw): `window` and `mr` (nullptr when
// length is 0 or the lkey names nothing) as the registry has them, the
// binding QP's PD and process. IBV_WC_SUCCESS or IBV_WC_MW_BIND_ERR.
ibv_wc_status check_bind(const host::MrRecord& window, const host::MrRecord* mr, const BindRequest& bind,
                         uint32_t qp_pd_id, uint32_t self_proc);

// The binding the window's key will describe once `bind` passed check_bind.
host::WindowBinding binding_for(const host::MrRecord& window, const host::MrRecord* mr, const BindRequest& bind,
                                uint32_t qpn);

class MemoryWindow {
 public:
  // IBV_MW_TYPE_1 or IBV_MW_TYPE_2; EINVAL for any other type.
  static Result<MemoryWindow*> create(ProtectionDomain& pd, uint32_t type);
  // ibv_dealloc_mw: the key goes, and once this returns no initiator reaches
  // memory through it (the deregistration fence).
  ~MemoryWindow();
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;

  uint32_t type() const { return type_; }
  ProtectionDomain& pd() { return pd_; }
  // The key as allocated or last bound.
  uint32_t key() const { return key_.load(std::memory_order_acquire); }

  // Executes a bind WR of QP `qpn` (PD `qp_pd_id`), from its send queue.
  // Binds of one window come from the send queues the application posted
  // them on, in its order; the registry's mutex orders them against
  // invalidations from elsewhere.
  ibv_wc_status bind(const BindRequest& bind, uint32_t qpn, uint32_t qp_pd_id);

 private:
  MemoryWindow(ProtectionDomain& pd, uint32_t type, uint32_t key) : pd_(pd), type_(type), key_(key) {}
  ProtectionDomain& pd_;
  uint32_t type_;
  std::atomic<uint32_t> key_;
};

// LOCAL_INV of `rkey` by a QP of PD `qp_pd_id` of this process: a bound type
// 2 window's key stops granting anything, and no access through it outlives
// the call. IBV_WC_SUCCESS or IBV_WC_LOC_QP_OP_ERR (an MR, a type 1 window,
// an unbound one, another PD's), as rxe completes a failed local operation.
ibv_wc_status invalidate_locally(host::HostRegistry& registry, uint32_t self_proc, uint32_t rkey, uint32_t qp_pd_id);

}  // namespace softhca::engine
