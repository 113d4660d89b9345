// Memory windows (verbs manual 2.3.5): type 1 bound with ibv_bind_mw and
// unbound with length 0, type 2 bound with IBV_WR_BIND_MW and invalidated
// with IBV_WR_LOCAL_INV or a peer's IBV_WR_SEND_WITH_INV; every rule the
// bind checks (IBV_WC_MW_BIND_ERR), invalidation errors, remote access
// through a window that no longer grants it (REM_ACCESS_ERR), and the fence:
// a peer writing through a window in a loop never lands a byte after the
// invalidation (or dealloc, or rebind) completed. Over shm by default; the
// udp.mw test runs the same with SOFTHCA_LINK=udp.
#include <atomic>
#include <thread>

#include "loopback.hpp"

namespace loopback {
namespace {

constexpr int kMwMrAccess = Buffer::kAllAccess | IBV_ACCESS_MW_BIND;
constexpr unsigned kRemoteRw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

struct Bound {
  int post_rc = 0;                       // ibv_bind_mw / ibv_post_send
  ibv_wc_status status = IBV_WC_GENERAL_ERR;  // the bind's completion
  uint32_t rkey = 0;                     // the window's new key
};

// Binds `mw` to [addr, addr + length) of `mr` through `qp` (completions on
// `cq`): type 1 with ibv_bind_mw, type 2 with an IBV_WR_BIND_MW whose key is
// the next of mw->rkey.
Bound bind(ibv_qp* qp, ibv_cq* cq, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t length, unsigned access,
           uint64_t wr_id = 900) {
  Bound out;
  ibv_mw_bind_info info{};
  info.mr = mr;
  info.addr = addr;
  info.length = length;
  info.mw_access_flags = access;
  if (mw->type == IBV_MW_TYPE_1) {
    ibv_mw_bind b{};
    b.wr_id = wr_id;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = info;
    out.post_rc = ibv_bind_mw(qp, mw, &b);
    out.rkey = mw->rkey;
  } else {
    ibv_send_wr wr = make_wr(wr_id, IBV_WR_BIND_MW, nullptr, 0);
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = info;
    out.post_rc = post_send(qp, wr);
    out.rkey = wr.bind_mw.rkey;
  }
  if (out.post_rc != 0) return out;
  ibv_wc wc{};
  if (!poll_one(cq, &wc)) return out;
  out.status = wc.status;
  if (wc.status == IBV_WC_SUCCESS) {
    EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, wr_id);
  }
  return out;
}

// One signaled WRITE or READ of `length` bytes of `local` through `rkey`; its status.
ibv_wc_status rdma(ibv_qp* qp, ibv_cq* cq, ibv_wr_opcode op, Buffer& local, uint32_t length, uint64_t remote,
                   uint32_t rkey) {
  ibv_sge sge = local.sge(0, length);
  ibv_send_wr wr = make_wr(1, op, &sge, 1);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  if (post_send(qp, wr) != 0) return IBV_WC_GENERAL_ERR;
  ibv_wc wc{};
  if (!poll_one(cq, &wc)) return IBV_WC_GENERAL_ERR;
  return wc.status;
}

ibv_wc_status local_inv(ibv_qp* qp, ibv_cq* cq, uint32_t rkey) {
  ibv_send_wr wr = make_wr(901, IBV_WR_LOCAL_INV, nullptr, 0);
  wr.invalidate_rkey = rkey;
  if (post_send(qp, wr) != 0) return IBV_WC_GENERAL_ERR;
  ibv_wc wc{};
  if (!poll_one(cq, &wc)) return IBV_WC_GENERAL_ERR;
  if (wc.status == IBV_WC_SUCCESS) {
    EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
  }
  return wc.status;
}

// A pair of RC QPs (a sends, b owns the windows), a target MR that allows
// binding and a source buffer.
struct WindowSetup {
  WindowSetup() : pair(dev, QpConfig{}), target(dev.pd, 4096, kMwMrAccess), src(dev.pd, 4096, Buffer::kAllAccess) {
    fill_pattern(src.span(0, src.size()), 7);
  }
  ~WindowSetup() { drain_async_events(dev.ctx); }
  bool ok() const { return pair.ok() && target.mr() != nullptr && src.mr() != nullptr; }
  Device dev;
  QpPair pair;
  Buffer target;
  Buffer src;
};

// ---------------------------------------------------------------------------

TEST(MemoryWindow, DeviceReportsWindows) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  EXPECT_GT(attr.max_mw, 0);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(dev.pd, static_cast<ibv_mw_type>(3)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(mw->type, IBV_MW_TYPE_2);
  EXPECT_EQ(mw->pd, dev.pd);
  EXPECT_NE(mw->rkey, 0u);
  // A PD with a window is busy.
  EXPECT_EQ(ibv_dealloc_pd(dev.pd), EBUSY);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type1BindWriteReadUnbind) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const uint32_t allocated = mw->rkey;
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(1024), 1024, kRemoteRw);
  ASSERT_EQ(b.post_rc, 0);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(b.rkey, ibv_inc_rkey(allocated)) << "ibv_bind_mw gives the window the next key";
  EXPECT_NE(b.rkey, s.target.rkey());
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 1024, s.target.addr(1024), b.rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(s.target.span(1024, 1024), s.src.span(0, 1024)), -1);
  EXPECT_EQ(first_not(s.target.span(0, 1024), 0), -1) << "nothing outside the window";
  Buffer back(s.dev.pd, 4096);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_READ, back, 512, s.target.addr(1536), b.rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(back.span(0, 512), s.src.span(512, 512)), -1);
  // A rebind moves the window (and changes its key again).
  const Bound moved = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(0), 512, kRemoteRw);
  ASSERT_EQ(moved.status, IBV_WC_SUCCESS);
  EXPECT_NE(moved.rkey, b.rkey);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 512, s.target.addr(0), moved.rkey),
            IBV_WC_SUCCESS);
  // Unbind: length 0 (and no MR).
  const Bound unbound = bind(s.pair.b, s.pair.b_send_cq, mw, nullptr, 0, 0, 0);
  ASSERT_EQ(unbound.post_rc, 0);
  ASSERT_EQ(unbound.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 512, s.target.addr(0), unbound.rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_ERR);
  EXPECT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_QP_ACCESS_ERR, nullptr));
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type1OldKeyStopsWorkingAtRebind) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const Bound first = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(first.status, IBV_WC_SUCCESS);
  const Bound second = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(second.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), first.rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type2BindWriteLocalInvalidate) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 4096, s.target.addr(), b.rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(s.target.span(0, 4096), s.src.span(0, 4096)), -1);
  EXPECT_EQ(local_inv(s.pair.b, s.pair.b_send_cq, b.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_RTS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_ERR);
  EXPECT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_QP_ACCESS_ERR, nullptr));
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type2RebindAfterInvalidation) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  ASSERT_EQ(local_inv(s.pair.b, s.pair.b_send_cq, b.rkey), IBV_WC_SUCCESS);
  b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(2048), 2048, IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 2048, s.target.addr(2048), b.rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(s.target.span(2048, 2048), s.src.span(0, 2048)), -1);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type2SendWithInvalidate) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  Buffer rbuf(s.dev.pd, 256);
  ibv_sge rsge = rbuf.sge(0, 256);
  ASSERT_EQ(post_recv(s.pair.b, 55, &rsge, 1), 0);
  ibv_sge sge = s.src.sge(0, 100);
  ibv_send_wr send = make_wr(56, IBV_WR_SEND_WITH_INV, &sge, 1);
  send.invalidate_rkey = b.rkey;
  ASSERT_EQ(post_send(s.pair.a, send), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 100u);
  EXPECT_EQ(wc.wr_id, 55u);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc.invalidated_rkey, b.rkey);
  EXPECT_EQ(first_mismatch(rbuf.span(0, 100), s.src.span(0, 100)), -1);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// SEND WITH INVALIDATE of a key that cannot be invalidated so (a type 1
// window, an MR): the responder refuses it as an invalid request.
class SendWithInvalidateRefused : public ::testing::TestWithParam<bool> {};

TEST_P(SendWithInvalidateRefused, IsRemoteInvalidRequest) {
  const bool of_mr = GetParam();
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  Buffer rbuf(s.dev.pd, 256);
  ibv_sge rsge = rbuf.sge(0, 256);
  ASSERT_EQ(post_recv(s.pair.b, 55, &rsge, 1), 0);
  ibv_send_wr send = make_wr(56, IBV_WR_SEND_WITH_INV, nullptr, 0);
  send.invalidate_rkey = of_mr ? s.target.rkey() : b.rkey;
  ASSERT_EQ(post_send(s.pair.a, send), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_ERR);
  EXPECT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_QP_REQ_ERR, nullptr));
  // The window still grants access, to a QP that works.
  QpPair other(s.dev, QpConfig{});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(rdma(other.a, other.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

INSTANTIATE_TEST_SUITE_P(Keys, SendWithInvalidateRefused, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Mr" : "Type1Window"; });

TEST(MemoryWindow, Type2ServesOnlyTheQpItWasBoundThrough) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  QpPair other(s.dev, QpConfig{});
  ASSERT_TRUE(other.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(other.a, other.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(first_not(s.target.span(0, 4096), 0), -1);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, Type1ServesEveryQpOfItsPd) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  QpPair other(s.dev, QpConfig{});
  ASSERT_TRUE(other.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(other.a, other.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), b.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// A bind posted behind operations still in flight (the udp link sends
// asynchronously) executes after them, and the completions come in order.
TEST(MemoryWindow, BindWaitsForTheOperationsPostedBeforeIt) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  Buffer remote(s.dev.pd, 64 * 1024);
  Buffer big(s.dev.pd, 64 * 1024, Buffer::kAllAccess, 0x31);
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  // On b's send queue: a 64 KiB WRITE to a, then the bind, then another WRITE.
  ibv_sge sge = big.sge(0, 64 * 1024);
  ibv_send_wr first = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  first.wr.rdma.remote_addr = remote.addr();
  first.wr.rdma.rkey = remote.rkey();
  ibv_send_wr bind_wr = make_wr(2, IBV_WR_BIND_MW, nullptr, 0);
  bind_wr.bind_mw.mw = mw;
  bind_wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  bind_wr.bind_mw.bind_info = ibv_mw_bind_info{s.target.mr(), s.target.addr(), 4096, kRemoteRw};
  ibv_send_wr second = first;
  second.wr_id = 3;
  first.next = &bind_wr;
  bind_wr.next = &second;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(s.pair.b, &first, &bad), 0);
  auto wcs = poll_n(s.pair.b_send_cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << wc_str(wcs[i]);
  }
  EXPECT_EQ(wcs[1].opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(first_not(remote.span(0, 64 * 1024), 0x31), -1);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 4096, s.target.addr(), bind_wr.bind_mw.rkey),
            IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// Zero based: the peer addresses the window from 0, wherever it starts in the MR.
TEST(MemoryWindow, Type2ZeroBased) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(1024), 1024,
                       kRemoteRw | IBV_ACCESS_ZERO_BASED);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 1024, 0, b.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(s.target.span(1024, 1024), s.src.span(0, 1024)), -1);
  EXPECT_EQ(first_not(s.target.span(0, 1024), 0), -1);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, 1024, b.rkey), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// Type 1 windows cannot be zero based: ibv_bind_mw refuses (as rxe's provider).
TEST(MemoryWindow, Type1ZeroBasedIsEinval) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const uint32_t before = mw->rkey;
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 64,
                       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED);
  EXPECT_EQ(b.post_rc, EINVAL);
  EXPECT_EQ(mw->rkey, before);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST(MemoryWindow, WindowKeyIsNoLkey) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(s.pair.a, s.pair.a_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  Buffer dst(s.dev.pd, 4096);
  ibv_sge sge{s.target.addr(), 64, b.rkey};
  ibv_send_wr wr = make_wr(3, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = dst.addr();
  wr.wr.rdma.rkey = dst.rkey();
  ASSERT_EQ(post_send(s.pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// Access through a bound window beyond what it grants: REM_ACCESS_ERR at the
// requester, QP_ACCESS_ERR and ERROR at the responder.
enum class Beyond { kOutsideRange, kNoRemoteWrite, kNoRemoteRead, kQpOfAnotherPd };

class WindowAccess : public ::testing::TestWithParam<Beyond> {};

TEST_P(WindowAccess, IsRemoteAccessError) {
  const Beyond v = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  Buffer target(dev.pd, 4096, kMwMrAccess);
  ASSERT_NE(target.mr(), nullptr);
  ibv_pd* other_pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other_pd, nullptr);
  {
    ibv_pd* qp_pd = v == Beyond::kQpOfAnotherPd ? other_pd : dev.pd;
    // The binding QP is of the window's PD; the pair under test may not be.
    QpPair binder(dev, QpConfig{});
    ASSERT_TRUE(binder.ok());
    // QpPair creates its QPs in dev.pd: lend it the PD under test meanwhile.
    ibv_pd* saved = dev.pd;
    dev.pd = qp_pd;
    QpPair pair(dev, QpConfig{});
    dev.pd = saved;
    ASSERT_TRUE(pair.ok());
    Buffer local(qp_pd, 4096);
    ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_1);
    ASSERT_NE(mw, nullptr);
    unsigned access = kRemoteRw;
    if (v == Beyond::kNoRemoteWrite) access = IBV_ACCESS_REMOTE_READ;
    if (v == Beyond::kNoRemoteRead) access = IBV_ACCESS_REMOTE_WRITE;
    const Bound b = bind(binder.b, binder.b_send_cq, mw, target.mr(), target.addr(1024), 1024, access);
    ASSERT_EQ(b.status, IBV_WC_SUCCESS);
    const ibv_wr_opcode op = v == Beyond::kNoRemoteRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    const uint64_t remote = v == Beyond::kOutsideRange ? target.addr(2000) : target.addr(1024);
    EXPECT_EQ(rdma(pair.a, pair.a_send_cq, op, local, 64, remote, b.rkey), IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
    EXPECT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, nullptr));
    EXPECT_EQ(first_not(target.span(0, 4096), 0), -1);
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    drain_async_events(dev.ctx);
  }
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, WindowAccess,
                         ::testing::Values(Beyond::kOutsideRange, Beyond::kNoRemoteWrite, Beyond::kNoRemoteRead,
                                           Beyond::kQpOfAnotherPd),
                         [](const auto& info) {
                           switch (info.param) {
                             case Beyond::kOutsideRange: return "OutsideRange";
                             case Beyond::kNoRemoteWrite: return "NoRemoteWrite";
                             case Beyond::kNoRemoteRead: return "NoRemoteRead";
                             case Beyond::kQpOfAnotherPd: return "QpOfAnotherPd";
                           }
                           return "?";
                         });

// Binds the rules refuse: the bind completes with IBV_WC_MW_BIND_ERR and the
// QP goes to ERROR (what it posted after the bind is flushed).
enum class BadBind {
  kMrWithoutBindAccess,
  kRangeBeyondMr,
  kWritableWindowOnMrWithoutLocalWrite,
  kType2BoundTwice,
  kType2ThroughQpOfAnotherPd,
  kType2LengthZero,
  kMrOfAnotherPd,
};

class BindError : public ::testing::TestWithParam<BadBind> {};

TEST_P(BindError, CompletesWithMwBindErrAndQpError) {
  const BadBind v = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* other_pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other_pd, nullptr);
  {
    int mr_access = kMwMrAccess;
    if (v == BadBind::kMrWithoutBindAccess) mr_access = Buffer::kAllAccess;
    if (v == BadBind::kWritableWindowOnMrWithoutLocalWrite) mr_access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND;
    Buffer target(v == BadBind::kMrOfAnotherPd ? other_pd : dev.pd, 4096, mr_access);
    ASSERT_NE(target.mr(), nullptr);
    ibv_pd* saved = dev.pd;
    if (v == BadBind::kType2ThroughQpOfAnotherPd) dev.pd = other_pd;
    QpPair pair(dev, QpConfig{});
    dev.pd = saved;
    ASSERT_TRUE(pair.ok());
    ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_2);
    ASSERT_NE(mw, nullptr);
    if (v == BadBind::kType2BoundTwice) {
      ASSERT_EQ(bind(pair.b, pair.b_send_cq, mw, target.mr(), target.addr(), 64, kRemoteRw).status, IBV_WC_SUCCESS);
    }
    const uint64_t length = v == BadBind::kRangeBeyondMr ? 4097 : v == BadBind::kType2LengthZero ? 0 : 64;
    const unsigned access =
        v == BadBind::kWritableWindowOnMrWithoutLocalWrite ? unsigned{IBV_ACCESS_REMOTE_WRITE} : kRemoteRw;
    // A WR behind the bind: flushed once the bind fails.
    ibv_send_wr bind_wr = make_wr(900, IBV_WR_BIND_MW, nullptr, 0);
    bind_wr.bind_mw.mw = mw;
    bind_wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    bind_wr.bind_mw.bind_info = ibv_mw_bind_info{target.mr(), target.addr(), length, access};
    ibv_send_wr after = make_wr(901, IBV_WR_SEND, nullptr, 0);
    bind_wr.next = &after;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.b, &bind_wr, &bad), 0);
    auto wcs = poll_n(pair.b_send_cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].wr_id, 900u);
    EXPECT_EQ(wcs[0].status, IBV_WC_MW_BIND_ERR) << wc_str(wcs[0]);
    EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR) << wc_str(wcs[1]);
    EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
    if (v != BadBind::kType2BoundTwice && v != BadBind::kType2ThroughQpOfAnotherPd) {
      // The window grants nothing: its would-be key does not work (through
      // a QP that is up; pair.b is in ERROR and would not answer at all).
      QpPair fresh(dev, QpConfig{});
      ASSERT_TRUE(fresh.ok());
      Buffer local(dev.pd, 64);
      EXPECT_EQ(rdma(fresh.a, fresh.a_send_cq, IBV_WR_RDMA_WRITE, local, 64, target.addr(), bind_wr.bind_mw.rkey),
                IBV_WC_REM_ACCESS_ERR);
    }
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    drain_async_events(dev.ctx);
  }
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
}

INSTANTIATE_TEST_SUITE_P(Rules, BindError,
                         ::testing::Values(BadBind::kMrWithoutBindAccess, BadBind::kRangeBeyondMr,
                                           BadBind::kWritableWindowOnMrWithoutLocalWrite, BadBind::kType2BoundTwice,
                                           BadBind::kType2ThroughQpOfAnotherPd, BadBind::kType2LengthZero,
                                           BadBind::kMrOfAnotherPd),
                         [](const auto& info) {
                           switch (info.param) {
                             case BadBind::kMrWithoutBindAccess: return "MrWithoutBindAccess";
                             case BadBind::kRangeBeyondMr: return "RangeBeyondMr";
                             case BadBind::kWritableWindowOnMrWithoutLocalWrite:
                               return "WritableWindowOnMrWithoutLocalWrite";
                             case BadBind::kType2BoundTwice: return "Type2BoundTwice";
                             case BadBind::kType2ThroughQpOfAnotherPd: return "Type2ThroughQpOfAnotherPd";
                             case BadBind::kType2LengthZero: return "Type2LengthZero";
                             case BadBind::kMrOfAnotherPd: return "MrOfAnotherPd";
                           }
                           return "?";
                         });

// ibv_bind_mw's own checks (the inline verb): an MR of another PD is EPERM,
// a type 2 window EINVAL.
TEST(MemoryWindow, BindMwVerbChecks) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_pd* other_pd = ibv_alloc_pd(s.dev.ctx);
  ASSERT_NE(other_pd, nullptr);
  {
    Buffer foreign(other_pd, 4096, kMwMrAccess);
    ibv_mw* mw1 = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_1);
    ibv_mw* mw2 = ibv_alloc_mw(s.dev.pd, IBV_MW_TYPE_2);
    ASSERT_NE(mw1, nullptr);
    ASSERT_NE(mw2, nullptr);
    ibv_mw_bind b{};
    b.bind_info = ibv_mw_bind_info{foreign.mr(), foreign.addr(), 64, IBV_ACCESS_REMOTE_WRITE};
    EXPECT_EQ(ibv_bind_mw(s.pair.b, mw1, &b), EPERM);
    b.bind_info.mr = s.target.mr();
    b.bind_info.addr = s.target.addr();
    EXPECT_EQ(ibv_bind_mw(s.pair.b, mw2, &b), EINVAL);
    EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_RTS);
    EXPECT_EQ(ibv_dealloc_mw(mw1), 0);
    EXPECT_EQ(ibv_dealloc_mw(mw2), 0);
  }
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
}

// LOCAL_INV of what it cannot invalidate completes with LOC_QP_OP_ERR (as
// rxe completes a failed local operation) and the QP goes to ERROR.
enum class BadInv { kType1Window, kMrKey, kUnboundType2, kNoSuchKey };

class LocalInvalidateError : public ::testing::TestWithParam<BadInv> {};

TEST_P(LocalInvalidateError, CompletesWithLocQpOpErr) {
  const BadInv v = GetParam();
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, v == BadInv::kType1Window ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  uint32_t key = mw->rkey;
  if (v == BadInv::kType1Window) {
    const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, s.target.mr(), s.target.addr(), 4096, kRemoteRw);
    ASSERT_EQ(b.status, IBV_WC_SUCCESS);
    key = b.rkey;
  }
  if (v == BadInv::kMrKey) key = s.target.rkey();
  if (v == BadInv::kNoSuchKey) key = mw->rkey ^ 0x5A5A00;
  EXPECT_EQ(local_inv(s.pair.b, s.pair.b_send_cq, key), IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_ERR);
  if (v == BadInv::kType1Window || v == BadInv::kMrKey) {
    // Still valid: another QP of the PD writes through it.
    QpPair other(s.dev, QpConfig{});
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(rdma(other.a, other.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, s.target.addr(), key), IBV_WC_SUCCESS);
  }
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

INSTANTIATE_TEST_SUITE_P(Keys, LocalInvalidateError,
                         ::testing::Values(BadInv::kType1Window, BadInv::kMrKey, BadInv::kUnboundType2,
                                           BadInv::kNoSuchKey),
                         [](const auto& info) {
                           switch (info.param) {
                             case BadInv::kType1Window: return "Type1Window";
                             case BadInv::kMrKey: return "MrKey";
                             case BadInv::kUnboundType2: return "UnboundType2";
                             case BadInv::kNoSuchKey: return "NoSuchKey";
                           }
                           return "?";
                         });

class DeallocBound : public ::testing::TestWithParam<ibv_mw_type> {};

TEST_P(DeallocBound, RevokesTheKey) {
  WindowSetup s;
  ASSERT_TRUE(s.ok());
  std::vector<uint8_t> bytes(4096, 0);
  ibv_mr* mr = ibv_reg_mr(s.dev.pd, bytes.data(), bytes.size(), kMwMrAccess);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = ibv_alloc_mw(s.dev.pd, GetParam());
  ASSERT_NE(mw, nullptr);
  const uint64_t addr = reinterpret_cast<uint64_t>(bytes.data());
  const Bound b = bind(s.pair.b, s.pair.b_send_cq, mw, mr, addr, 4096, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  ASSERT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(rdma(s.pair.a, s.pair.a_send_cq, IBV_WR_RDMA_WRITE, s.src, 64, addr, b.rkey), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(first_not(bytes, 0), -1);
  // The MR has no window left: it deregisters.
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

INSTANTIATE_TEST_SUITE_P(Types, DeallocBound, ::testing::Values(IBV_MW_TYPE_1, IBV_MW_TYPE_2),
                         [](const auto& info) { return info.param == IBV_MW_TYPE_1 ? "Type1" : "Type2"; });

// Deregistering an MR with a window bound is refused (EINVAL, as rxe) and
// changes nothing; once the window is unbound or gone it succeeds.
TEST(MemoryWindow, DeregOfAnMrWithWindowsBoundIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  std::vector<uint8_t> bytes(4096, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, bytes.data(), bytes.size(), kMwMrAccess);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw1 = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_1);
  ibv_mw* mw2 = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw1, nullptr);
  ASSERT_NE(mw2, nullptr);
  const Bound b1 = bind(pair.b, pair.b_send_cq, mw1, mr, reinterpret_cast<uint64_t>(bytes.data()), 64, kRemoteRw);
  const Bound b2 = bind(pair.b, pair.b_send_cq, mw2, mr, reinterpret_cast<uint64_t>(bytes.data()), 64, kRemoteRw);
  ASSERT_EQ(b1.status, IBV_WC_SUCCESS);
  ASSERT_EQ(b2.status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(mr), EINVAL);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, Buffer::kAllAccess),
            IBV_REREG_MR_ERR_CMD);
  Buffer src(dev.pd, 64, Buffer::kAllAccess, 0x77);
  EXPECT_EQ(rdma(pair.a, pair.a_send_cq, IBV_WR_RDMA_WRITE, src, 64, reinterpret_cast<uint64_t>(bytes.data()),
                 b1.rkey),
            IBV_WC_SUCCESS)
      << "the refused dereg changed nothing";
  ASSERT_EQ(bind(pair.b, pair.b_send_cq, mw1, nullptr, 0, 0, 0).status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(mr), EINVAL) << "the type 2 window is still bound";
  ASSERT_EQ(local_inv(pair.b, pair.b_send_cq, b2.rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw1), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw2), 0);
}

// ---------------------------------------------------------------------------
// The fence: a thread writes 16 KiB WRITEs through a window, one at a time,
// while the main thread takes the window's access away and at once reuses
// the memory. No byte may land after the invalidation completed; the
// writer's first WRITE after it fails with REM_ACCESS_ERR.

constexpr uint8_t kWritten = 0xAB;
constexpr uint8_t kReused = 0x5A;

class WriterThread {
 public:
  WriterThread(ibv_qp* qp, ibv_cq* cq, ibv_send_wr wr)
      : thread_([this, qp, cq, wr]() mutable {
          for (int i = 0; i < 1000000; ++i) {
            wr.wr_id = static_cast<uint64_t>(i);
            if (post_send(qp, wr) != 0) return;
            ibv_wc wc{};
            if (!poll_one(cq, &wc)) return;
            last_status = wc.status;
            if (wc.status != IBV_WC_SUCCESS) return;
            ++completed;
          }
        }) {}
  ~WriterThread() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  bool got_going() {
    const auto until = Clock::now() + kDeadline;
    while (completed.load() < 10 && Clock::now() < until) std::this_thread::yield();
    return completed.load() >= 10;
  }
  std::atomic<int> completed{0};
  std::atomic<int> last_status{-1};

 private:
  std::thread thread_;
};

enum class Revoke { kLocalInvalidate, kSendWithInvalidate, kDealloc, kType1Unbind, kType1Rebind };

class WindowFence : public ::testing::TestWithParam<Revoke> {};

TEST_P(WindowFence, NoWriteLandsAfterTheWindowWent) {
  const Revoke how = GetParam();
  const bool type1 = how == Revoke::kType1Unbind || how == Revoke::kType1Rebind;
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{}, 64);
  ASSERT_TRUE(pair.ok());
  QpPair control(dev, QpConfig{}, 64);  // the SEND WITH INVALIDATE goes this way
  ASSERT_TRUE(control.ok());
  constexpr size_t kLen = 16 * 1024;
  std::vector<uint8_t> target(kLen, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, target.data(), target.size(), kMwMrAccess);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = ibv_alloc_mw(dev.pd, type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const Bound b = bind(pair.b, pair.b_send_cq, mw, mr, reinterpret_cast<uint64_t>(target.data()), kLen, kRemoteRw);
  ASSERT_EQ(b.status, IBV_WC_SUCCESS);
  Buffer src(dev.pd, kLen, Buffer::kAllAccess, kWritten);
  ibv_sge sge = src.sge(0, kLen);
  ibv_send_wr wr = make_wr(0, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(target.data());
  wr.wr.rdma.rkey = b.rkey;
  WriterThread writer(pair.a, pair.a_send_cq, wr);
  ASSERT_TRUE(writer.got_going()) << "the writer did not get going";
  switch (how) {
    case Revoke::kLocalInvalidate:
      ASSERT_EQ(local_inv(pair.b, pair.b_send_cq, b.rkey), IBV_WC_SUCCESS);
      break;
    case Revoke::kSendWithInvalidate: {
      ibv_sge rsge{};
      ASSERT_EQ(post_recv(control.b, 1, &rsge, 0), 0);
      ibv_send_wr send = make_wr(2, IBV_WR_SEND_WITH_INV, nullptr, 0);
      send.invalidate_rkey = b.rkey;
      ASSERT_EQ(post_send(control.a, send), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(control.b_recv_cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
      break;
    }
    case Revoke::kDealloc:
      ASSERT_EQ(ibv_dealloc_mw(mw), 0);
      mw = nullptr;
      break;
    case Revoke::kType1Unbind:
      ASSERT_EQ(bind(pair.b, pair.b_send_cq, mw, nullptr, 0, 0, 0).status, IBV_WC_SUCCESS);
      break;
    case Revoke::kType1Rebind:
      ASSERT_EQ(bind(pair.b, pair.b_send_cq, mw, mr, reinterpret_cast<uint64_t>(target.data()), kLen, kRemoteRw)
                    .status,
                IBV_WC_SUCCESS);
      break;
  }
  std::memset(target.data(), kReused, target.size());
  writer.join();
  EXPECT_EQ(writer.last_status.load(), IBV_WC_REM_ACCESS_ERR) << "the writer's first WRITE after the window went";
  EXPECT_EQ(first_not(target, kReused), -1) << "a WRITE landed after the window went";
  if (mw != nullptr) {
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  }
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  drain_async_events(dev.ctx);
}

INSTANTIATE_TEST_SUITE_P(Ways, WindowFence,
                         ::testing::Values(Revoke::kLocalInvalidate, Revoke::kSendWithInvalidate, Revoke::kDealloc,
                                           Revoke::kType1Unbind, Revoke::kType1Rebind),
                         [](const auto& info) {
                           switch (info.param) {
                             case Revoke::kLocalInvalidate: return "LocalInvalidate";
                             case Revoke::kSendWithInvalidate: return "SendWithInvalidate";
                             case Revoke::kDealloc: return "Dealloc";
                             case Revoke::kType1Unbind: return "Type1Unbind";
                             case Revoke::kType1Rebind: return "Type1Rebind";
                           }
                           return "?";
                         });

// The extended QP API: ibv_wr_bind_mw, ibv_wr_local_inv, ibv_wr_send_inv.
ibv_qp* create_qp_ex(Device& dev, ibv_cq* cq, uint64_t ops) {
  ibv_qp_init_attr_ex init{};
  init.qp_type = IBV_QPT_RC;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap.max_send_wr = init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  init.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  init.pd = dev.pd;
  init.send_ops_flags = ops;
  return ibv_create_qp_ex(dev.ctx, &init);
}

TEST(MemoryWindow, ExtendedQpOperations) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq_a = ibv_create_cq(dev.ctx, 32, nullptr, nullptr, 0);
  ibv_cq* cq_b = ibv_create_cq(dev.ctx, 32, nullptr, nullptr, 0);
  ASSERT_NE(cq_a, nullptr);
  ASSERT_NE(cq_b, nullptr);
  const uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
                       IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV;
  ibv_qp* a = create_qp_ex(dev, cq_a, ops);
  ibv_qp* b = create_qp_ex(dev, cq_b, ops);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ASSERT_NE(b, nullptr);
  QpConfig cfg;
  ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(bring_up(b, a->qp_num, dev.gid, cfg), 0);
  {
    Buffer target(dev.pd, 4096, kMwMrAccess);
    Buffer src(dev.pd, 4096, Buffer::kAllAccess, 0x42);
    ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_2);
    ASSERT_NE(mw, nullptr);
    ibv_qp_ex* bx = ibv_qp_to_qp_ex(b);
    ibv_qp_ex* ax = ibv_qp_to_qp_ex(a);
    ASSERT_NE(ax, nullptr);
    ASSERT_NE(bx, nullptr);
    const uint32_t key = ibv_inc_rkey(mw->rkey);
    const ibv_mw_bind_info info{target.mr(), target.addr(), 4096, IBV_ACCESS_REMOTE_WRITE};
    ibv_wr_start(bx);
    bx->wr_id = 10;
    bx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_bind_mw(bx, mw, key, &info);
    ASSERT_EQ(ibv_wr_complete(bx), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(cq_b, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
    // WRITE through it, then SEND WITH INVALIDATE.
    ibv_sge rsge{};
    ASSERT_EQ(post_recv(b, 20, &rsge, 0), 0);
    ibv_wr_start(ax);
    ax->wr_id = 11;
    ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(ax, key, target.addr());
    ibv_wr_set_sge(ax, src.lkey(), src.addr(), 4096);
    ax->wr_id = 12;
    ibv_wr_send_inv(ax, key);
    ibv_wr_set_sge(ax, src.lkey(), src.addr(), 0);
    ASSERT_EQ(ibv_wr_complete(ax), 0);
    auto wcs = poll_n(cq_a, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
    ASSERT_TRUE(poll_one(cq_b, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
    EXPECT_EQ(wc.invalidated_rkey, key);
    EXPECT_EQ(first_not(target.span(0, 4096), 0x42), -1);
    // Bind again, invalidate locally with ibv_wr_local_inv.
    ibv_wr_start(bx);
    bx->wr_id = 13;
    bx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_bind_mw(bx, mw, key, &info);
    bx->wr_id = 14;
    ibv_wr_local_inv(bx, key);
    ASSERT_EQ(ibv_wr_complete(bx), 0);
    wcs = poll_n(cq_b, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[1].opcode, IBV_WC_LOCAL_INV);
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  }
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_cq(cq_a), 0);
  EXPECT_EQ(ibv_destroy_cq(cq_b), 0);
}

}  // namespace
}  // namespace loopback
