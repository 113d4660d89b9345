// The structs an application sees, and how the shim gets from them to engine objects.
//
// The shim owns every struct the application can touch. Each handle embeds the
// public rdma-core struct first (offset 0, checked below) and then points at the
// engine object; to_*() converts back, as rxe's to_rqp() does.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "common/spinlock.hpp"
#include "engine/completion_queue.hpp"

namespace softhca::engine {
class Context;
class ProtectionDomain;
class MemoryRegion;
class MemoryWindow;
class CompletionQueue;
class CompletionChannel;
class QueuePair;
class SharedReceiveQueue;
class Flow;
class AddressHandle;
class XrcDomain;
class DeviceMemory;
}  // namespace softhca::engine

namespace softhca::abi {

// ibv_device followed by a pointer-sized field: libmlx5/libefa read
// *(ops**)((char*)dev + sizeof(ibv_device)) to recognise their own devices.
struct DeviceHandle {
  ibv_device device;
  const void* provider_ops;  // always nullptr: never equal to mlx5's or efa's ops
  unsigned magic;
};
static_assert(offsetof(DeviceHandle, device) == 0);
static_assert(offsetof(DeviceHandle, provider_ops) == sizeof(ibv_device));
inline constexpr unsigned kDeviceMagic = 0x50f7c0deu;

// The context is a verbs_context whose last member is the ibv_context the app sees.
struct ContextHandle {
  verbs_context vctx;
  engine::Context* impl;
  // An imported context's cmd_fd: the dup the application handed to
  // ibv_import_device, which ibv_close_device closes (rdma-core's rule);
  // -1 for an opened one, whose fd the engine context owns.
  int imported_fd = -1;
};
static_assert(offsetof(ContextHandle, vctx) == 0);

// A thread domain (ibv_alloc_td): a hint for providers that keep per-thread
// hardware resources. softhca has none; it counts the parent domains using it.
struct TdHandle {
  ibv_td td;
  std::atomic<uint32_t> parent_domains{0};
};

// A protection domain, or a parent domain (ibv_alloc_parent_domain): then
// `impl` is the protection domain it was made from, so every verb taking a
// PD works on either, and `parent_domain` is set.
struct PdHandle {
  ibv_pd pd;
  engine::ProtectionDomain* impl;
  bool parent_domain = false;
  TdHandle* td = nullptr;
};
struct MrHandle {
  ibv_mr mr;
  engine::MemoryRegion* impl;
  engine::DeviceMemory* dm = nullptr;  // ibv_reg_dm_mr: the device memory it holds
};
struct MwHandle {
  ibv_mw mw;
  engine::MemoryWindow* impl;
};
static_assert(offsetof(MwHandle, mw) == 0);
// Every CQ is allocated as an ibv_cq_ex: ibv_cq_ex_to_cq() is a cast, and the
// ex layout starts with the ibv_cq layout. Every CQ, legacy or not, also
// answers the extended poll API (cq_ex.cpp): start_poll takes `poll_lock`
// (unless created SINGLE_THREADED) and parks the completion it popped in
// `current`, where the read_* ops find it; end_poll releases the lock.
struct CqHandle {
  ibv_cq_ex cq;
  engine::CompletionQueue* impl;
  engine::Completion current{};      // the completion start_poll/next_poll gave out
  uint64_t wc_flags = 0;   // ibv_create_cq_wc_flags asked at creation
  bool single_threaded = false;
  bool polling = false;    // between a successful start_poll and end_poll
  SpinLock poll_lock;
};
struct ChannelHandle {
  ibv_comp_channel channel;
  engine::CompletionChannel* impl;
};
// The work requests one ibv_wr_start..ibv_wr_complete builds (qp_ex.cpp).
struct QpExBatch;
struct QpExBatchDeleter {
  void operator()(QpExBatch* batch) const noexcept;
};
// Every QP is allocated as an ibv_qp_ex; ibv_qp_to_qp_ex() hands it out only for
// QPs created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, the ones with a `batch`.
struct IndTableHandle;
struct QpHandle {
  ibv_qp_ex qp;
  engine::QueuePair* impl;
  std::unique_ptr<QpExBatch, QpExBatchDeleter> batch;  // null: no new post-send API
  IndTableHandle* rss_table = nullptr;  // an RSS QP's indirection table, held while it lives
};
// A receive work queue (ibv_create_wq): an engine raw packet QP that has a
// receive queue only; RDY is its RTR. Indirection tables that name it hold it.
struct WqHandle {
  ibv_wq wq;
  engine::QueuePair* impl;
  std::atomic<uint32_t> tables{0};
};
// An indirection table (ibv_create_rwq_ind_table): its work queues, each
// held; RSS QPs made with it hold it.
struct IndTableHandle {
  ibv_rwq_ind_table table;
  std::vector<WqHandle*> wqs;
  std::atomic<uint32_t> qps{0};
};
struct FlowHandle {
  ibv_flow flow;
  engine::Flow* impl;
};
struct SrqHandle {
  ibv_srq srq;
  engine::SharedReceiveQueue* impl;
};
struct AhHandle {
  ibv_ah ah;
  engine::AddressHandle* impl;
};
struct XrcdHandle {
  ibv_xrcd xrcd;
  engine::XrcDomain* impl;
};
struct DmHandle {
  ibv_dm dm;
  engine::DeviceMemory* impl;
};
static_assert(offsetof(PdHandle, pd) == 0 && offsetof(MrHandle, mr) == 0 && offsetof(CqHandle, cq) == 0 &&
              offsetof(ChannelHandle, channel) == 0 && offsetof(QpHandle, qp) == 0 &&
              offsetof(SrqHandle, srq) == 0 && offsetof(AhHandle, ah) == 0 && offsetof(XrcdHandle, xrcd) == 0 &&
              offsetof(DmHandle, dm) == 0 && offsetof(FlowHandle, flow) == 0 && offsetof(WqHandle, wq) == 0 &&
              offsetof(IndTableHandle, table) == 0);
static_assert(std::is_standard_layout_v<ContextHandle> && std::is_standard_layout_v<QpHandle>);

inline ContextHandle* to_context_handle(ibv_context* ctx) {
  if (ctx == nullptr) return nullptr;
  auto* vctx = reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(ctx) - offsetof(verbs_context, context));
  return reinterpret_cast<ContextHandle*>(vctx);
}
inline engine::Context* to_context(ibv_context* ctx) {
  ContextHandle* h = to_context_handle(ctx);
  return h ? h->impl : nullptr;
}
inline engine::ProtectionDomain* to_pd(ibv_pd* pd) { return pd ? reinterpret_cast<PdHandle*>(pd)->impl : nullptr; }
inline bool is_parent_domain(ibv_pd* pd) { return pd != nullptr && reinterpret_cast<PdHandle*>(pd)->parent_domain; }
inline engine::MemoryRegion* to_mr(ibv_mr* mr) { return mr ? reinterpret_cast<MrHandle*>(mr)->impl : nullptr; }
inline engine::MemoryWindow* to_mw(ibv_mw* mw) { return mw ? reinterpret_cast<MwHandle*>(mw)->impl : nullptr; }
inline engine::CompletionQueue* to_cq(ibv_cq* cq) { return cq ? reinterpret_cast<CqHandle*>(cq)->impl : nullptr; }
inline engine::CompletionQueue* to_cq(ibv_cq_ex* cq) { return cq ? reinterpret_cast<CqHandle*>(cq)->impl : nullptr; }
inline engine::CompletionChannel* to_channel(ibv_comp_channel* ch) {
  return ch ? reinterpret_cast<ChannelHandle*>(ch)->impl : nullptr;
}
inline engine::QueuePair* to_qp(ibv_qp* qp) { return qp ? reinterpret_cast<QpHandle*>(qp)->impl : nullptr; }
inline engine::Flow* to_flow(ibv_flow* flow) { return flow ? reinterpret_cast<FlowHandle*>(flow)->impl : nullptr; }
inline engine::SharedReceiveQueue* to_srq(ibv_srq* srq) { return srq ? reinterpret_cast<SrqHandle*>(srq)->impl : nullptr; }
inline engine::DeviceMemory* to_dm(ibv_dm* dm) { return dm ? reinterpret_cast<DmHandle*>(dm)->impl : nullptr; }
inline engine::XrcDomain* to_xrcd(ibv_xrcd* xrcd) { return xrcd ? reinterpret_cast<XrcdHandle*>(xrcd)->impl : nullptr; }
inline engine::AddressHandle* to_ah(ibv_ah* ah) { return ah ? reinterpret_cast<AhHandle*>(ah)->impl : nullptr; }

// The C conventions, one helper each (man pages of the verbs):
//   int verbs     -> 0 or a positive errno, and errno set to that same value
//   pointer verbs -> the pointer, or nullptr with errno set
// The man pages ask int verbs only for the return value, but with a kernel
// provider errno holds it too (the failed write()/ioctl() set it), and
// programs print strerror(errno) after a failed int verb (UCX does). So a
// failed int verb sets errno as well; a successful one leaves it alone.
// Both catch everything: no exception crosses the C boundary.

// For an int verb's error path outside int_verb: sets errno, returns it.
inline int fail_with(int err) noexcept {
  errno = err;
  return err;
}

template <typename Fn>
int int_verb(Fn&& fn) noexcept {
  try {
    const int ret = fn();
    if (ret != 0) errno = ret;
    return ret;
  } catch (const std::bad_alloc&) {
    return fail_with(ENOMEM);
  } catch (...) {
    return fail_with(EIO);
  }
}

template <typename Fn>
auto pointer_verb(Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (...) {
    errno = EIO;
  }
  return nullptr;
}

}  // namespace softhca::abi
