// Memory windows: ibv_alloc_mw, ibv_bind_mw and ibv_dealloc_mw reach these
// through ibv_context.ops (the verbs are inline in <infiniband/verbs.h>).
// Binding itself is a send-queue operation (IBV_WR_BIND_MW): type 1's
// ibv_bind_mw posts one, as rdma-core's rxe provider does.
#include <cerrno>
#include <cstring>

#include "engine/memory_window.hpp"
#include "engine/qp/queue_pair.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {

engine::MemoryWindow* memory_window_of(ibv_mw* mw) { return to_mw(mw); }
engine::MemoryRegion* memory_region_of(ibv_mr* mr) { return to_mr(mr); }

ibv_mw* alloc_mw_op(ibv_pd* pd, ibv_mw_type type) {
  return pointer_verb([&]() -> ibv_mw* {
    engine::ProtectionDomain* impl = to_pd(pd);
    if (impl == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto mw = engine::MemoryWindow::create(*impl, static_cast<uint32_t>(type));
    if (!mw) {
      errno = to_errno(mw.error());
      return nullptr;
    }
    auto* h = new MwHandle{};
    h->impl = *mw;
    h->mw.context = pd->context;
    h->mw.pd = pd;
    h->mw.rkey = (*mw)->key();
    h->mw.handle = (*mw)->key();
    h->mw.type = type;
    return &h->mw;
  });
}

int dealloc_mw_op(ibv_mw* mw) {
  return int_verb([&] {
    engine::MemoryWindow* impl = to_mw(mw);
    if (impl == nullptr) return EINVAL;
    delete impl;
    delete reinterpret_cast<MwHandle*>(mw);
    return 0;
  });
}

// ibv_bind_mw (type 1; the inline verb checked the type, the MR's PD and an
// empty range without an MR): a bind WR with the next key, posted on `qp`.
// mw->rkey takes the new key once posted; a bind that then completes in
// error leaves the window as it was, and the application must undo it.
int bind_mw_op(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind) {
  return int_verb([&] {
    engine::QueuePair* impl = to_qp(qp);
    if (impl == nullptr || to_mw(mw) == nullptr || mw_bind == nullptr) return EINVAL;
    if (mw_bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED) return EINVAL;
    ibv_send_wr wr;
    std::memset(&wr, 0, sizeof wr);
    wr.wr_id = mw_bind->wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = mw_bind->send_flags;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = mw_bind->bind_info;
    ibv_send_wr* bad = nullptr;
    if (const int err = impl->post_send(&wr, &bad); err != 0) return err;
    mw->rkey = wr.bind_mw.rkey;
    return 0;
  });
}

}  // namespace softhca::abi
