// Device memory (ibv_alloc_dm and friends) through the public verbs API:
// the copy rules (whole 4-byte words inside the allocation), the budget of
// max_dm_size per process, and a DM registered with ibv_reg_dm_mr reached
// by a peer QP like any MR, zero-based.
#include "loopback.hpp"

namespace {

using loopback::Buffer;
using loopback::Device;

ibv_dm* alloc_dm(ibv_context* ctx, size_t length, uint32_t log_align = 0) {
  ibv_alloc_dm_attr attr{};
  attr.length = length;
  attr.log_align_req = log_align;
  return ibv_alloc_dm(ctx, &attr);
}

uint64_t max_dm_size(ibv_context* ctx) {
  ibv_device_attr_ex attr{};
  if (ibv_query_device_ex(ctx, nullptr, &attr) != 0) return 0;
  return attr.max_dm_size;
}

TEST(DeviceMemory, CopiesAreWholeWordsInsideTheAllocation) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_dm* dm = alloc_dm(dev.ctx, 256);
  ASSERT_NE(dm, nullptr) << "errno " << errno;
  std::vector<uint8_t> in(64), out(64, 0);
  loopback::fill_pattern(in, 9);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 128, in.data(), 64), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm, 128, 64), 0);
  EXPECT_EQ(in, out);
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 2, in.data(), 4), EINVAL);      // offset not a word
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 0, in.data(), 6), EINVAL);      // length not a word
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 256, in.data(), 4), EINVAL);    // past the end
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, 200, 64), EINVAL);  // runs past the end
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

TEST(DeviceMemory, BudgetIsMaxDmSizePerProcess) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const uint64_t max = max_dm_size(dev.ctx);
  ASSERT_GT(max, 0u);
  errno = 0;
  EXPECT_EQ(alloc_dm(dev.ctx, max + 4), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ibv_dm* all = alloc_dm(dev.ctx, max);
  ASSERT_NE(all, nullptr);
  errno = 0;
  EXPECT_EQ(alloc_dm(dev.ctx, 4), nullptr);  // spent
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(ibv_free_dm(all), 0);
  ibv_dm* again = alloc_dm(dev.ctx, 4);  // given back
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(ibv_free_dm(again), 0);
  // Nothing but length and alignment can be asked for.
  ibv_alloc_dm_attr attr{};
  attr.length = 64;
  attr.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(alloc_dm(dev.ctx, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(DeviceMemory, RegisteredDmIsZeroBasedAndHeldByItsMr) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_dm* dm = alloc_dm(dev.ctx, 4096);
  ASSERT_NE(dm, nullptr);
  constexpr int kAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ;
  // Zero-based only, and inside the DM.
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(dev.pd, dm, 0, 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(dev.pd, dm, 4000, 200, kAccess), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = ibv_reg_dm_mr(dev.pd, dm, 1024, 1024, kAccess);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);  // the MR holds it

  // A peer QP writes into the DM at zero-based address 16, then reads it back.
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  loopback::QpConfig cfg;
  ibv_qp* a = loopback::create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* b = loopback::create_qp(dev.pd, cq, cq, cfg);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(loopback::bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(loopback::bring_up(b, a->qp_num, dev.gid, cfg), 0);
  {
    Buffer local(dev.pd, 256);
    loopback::fill_pattern(local.span(0, 128), 21);
    ibv_sge sge = local.sge(0, 128);
    ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma = {16, mr->rkey};
    ASSERT_EQ(loopback::post_send(a, wr), 0);
    ibv_wc wc{};
    ASSERT_TRUE(loopback::poll_one(cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
    std::vector<uint8_t> seen(128);
    ASSERT_EQ(ibv_memcpy_from_dm(seen.data(), dm, 1024 + 16, 128), 0);
    EXPECT_EQ(loopback::first_mismatch(local.span(0, 128), seen), -1);

    ibv_sge back = local.sge(128, 128);
    ibv_send_wr rd = loopback::make_wr(2, IBV_WR_RDMA_READ, &back, 1);
    rd.wr.rdma = {16, mr->rkey};
    ASSERT_EQ(loopback::post_send(a, rd), 0);
    ASSERT_TRUE(loopback::poll_one(cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
    EXPECT_EQ(loopback::first_mismatch(local.span(0, 128), local.span(128, 128)), -1);

    // Past the MR's 1024 bytes: the DM's own bytes beyond it are not reachable.
    ibv_send_wr out = loopback::make_wr(3, IBV_WR_RDMA_WRITE, &sge, 1);
    out.wr.rdma = {1024 - 64, mr->rkey};
    ASSERT_EQ(loopback::post_send(a, out), 0);
    ASSERT_TRUE(loopback::poll_one(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  }
  loopback::drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

TEST(DeviceMemory, EmptyDmMrIsAllowed) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_dm* dm = alloc_dm(dev.ctx, 64);
  ASSERT_NE(dm, nullptr);
  ibv_mr* mr = ibv_reg_dm_mr(dev.pd, dm, 0, 0, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

}  // namespace
