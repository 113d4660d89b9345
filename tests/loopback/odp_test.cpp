// On-demand paging (IBV_ACCESS_ON_DEMAND), explicit and implicit, and
// ibv_advise_mr, through the public verbs API in one process. An implicit MR
// covers the whole address space and nothing of it is checked at
// registration, so the hostile cases matter most: a reference through it to
// memory that is not mapped must end in a completion error, never in a fault
// inside the library.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>

#include "loopback.hpp"

namespace {

using loopback::Buffer;
using loopback::Device;

constexpr int kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;

// An RC pair of this process, each QP with its own CQ.
class OdpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    cq_a = ibv_create_cq(dev.ctx, 32, nullptr, nullptr, 0);
    cq_b = ibv_create_cq(dev.ctx, 32, nullptr, nullptr, 0);
    ASSERT_TRUE(cq_a && cq_b);
    cfg.retry_cnt = 1;
    cfg.timeout = 8;
    a = loopback::create_qp(dev.pd, cq_a, cq_a, cfg);
    b = loopback::create_qp(dev.pd, cq_b, cq_b, cfg);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(loopback::bring_up(a, b->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(loopback::bring_up(b, a->qp_num, dev.gid, cfg), 0);
  }
  void TearDown() override {
    loopback::drain_async_events(dev.ctx);
    for (ibv_qp* qp : {a, b}) {
      if (qp != nullptr) {
        EXPECT_EQ(ibv_destroy_qp(qp), 0);
      }
    }
    for (ibv_cq* cq : {cq_a, cq_b}) {
      if (cq != nullptr) {
        EXPECT_EQ(ibv_destroy_cq(cq), 0);
      }
    }
  }

  // One signaled WR on `a`; its completion.
  ibv_wc run(ibv_send_wr wr) {
    ibv_wc wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    if (loopback::post_send(a, wr) != 0) return wc;
    if (!loopback::poll_one(cq_a, &wc)) wc.status = IBV_WC_GENERAL_ERR;
    return wc;
  }

  Device dev;
  loopback::QpConfig cfg;
  ibv_cq* cq_a = nullptr;
  ibv_cq* cq_b = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
};

// A page the process can use, and one right after it that it cannot: mapped
// PROT_NONE, so that no other mapping (a thread's stack, the sanitizers'
// memory) can take the address while the test runs, as it could once the
// page was unmapped, yet every access to it fails as one to unmapped memory.
struct Pages {
  Pages() {
    base = static_cast<uint8_t*>(mmap(nullptr, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base != MAP_FAILED && mprotect(base + 4096, 4096, PROT_NONE) != 0) {
      munmap(base, 2 * 4096);
      base = static_cast<uint8_t*>(MAP_FAILED);
    }
  }
  ~Pages() {
    if (base != MAP_FAILED) munmap(base, 2 * 4096);
  }
  uint8_t* mapped() const { return base; }
  uint64_t unmapped() const { return reinterpret_cast<uint64_t>(base + 4096); }
  uint8_t* base;
};

TEST_F(OdpTest, DeviceReportsOdpForEveryTransport) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &attr), 0);
  EXPECT_EQ(attr.odp_caps.general_caps & (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT),
            uint64_t{IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT});
  const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
  EXPECT_EQ(rc & (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                  IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV),
            uint32_t{IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                     IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV});
  EXPECT_NE(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND, 0u);
  EXPECT_NE(attr.xrc_odp_caps & IBV_ODP_SUPPORT_SRQ_RECV, 0u);
}

TEST_F(OdpTest, ExplicitOdpMrCarriesWritesAndReads) {
  Buffer local(dev.pd, 4096), remote(dev.pd, 4096, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(remote.mr(), nullptr);
  loopback::fill_pattern(local.span(0, 4096), 11);
  ibv_sge sge = local.sge(0, 4096);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma = {remote.addr(0), remote.rkey()};
  ibv_wc wc = run(wr);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  EXPECT_EQ(loopback::first_mismatch(local.span(0, 4096), remote.span(0, 4096)), -1);
}

TEST_F(OdpTest, ImplicitMrReachesAnyMappedMemory) {
  ibv_mr* implicit = ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(implicit, nullptr) << "errno " << errno;
  {
    std::vector<uint8_t> from(512), to(512, 0);
    loopback::fill_pattern(from, 5);
    // Both sides through the one implicit key: the lkey for the source, the rkey for the target.
    ibv_sge sge{reinterpret_cast<uint64_t>(from.data()), 512, implicit->lkey};
    ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma = {reinterpret_cast<uint64_t>(to.data()), implicit->rkey};
    ibv_wc wc = run(wr);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
    EXPECT_EQ(from, to);
  }
  EXPECT_EQ(ibv_dereg_mr(implicit), 0);
}

// Only ON_DEMAND makes (NULL, SIZE_MAX) a valid registration.
TEST_F(OdpTest, ImplicitRangeNeedsOnDemand) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(OdpTest, RkeyToUnmappedMemoryIsRemoteAccessError) {
  Pages pages;
  ASSERT_NE(pages.base, MAP_FAILED);
  ibv_mr* implicit = ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(implicit, nullptr);
  Buffer local(dev.pd, 64);
  ibv_sge sge = local.sge(0, 64);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma = {pages.unmapped(), implicit->rkey};
  ibv_wc wc = run(wr);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  EXPECT_EQ(ibv_dereg_mr(implicit), 0);
}

TEST_F(OdpTest, AtomicOnUnmappedMemoryIsRemoteAccessError) {
  Pages pages;
  ASSERT_NE(pages.base, MAP_FAILED);
  ibv_mr* implicit = ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(implicit, nullptr);
  Buffer local(dev.pd, 64);
  ibv_sge sge = local.sge(0, 8);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, 1);
  wr.wr.atomic.remote_addr = pages.unmapped();
  wr.wr.atomic.rkey = implicit->rkey;
  wr.wr.atomic.compare_add = 1;
  ibv_wc wc = run(wr);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  EXPECT_EQ(ibv_dereg_mr(implicit), 0);
}

TEST_F(OdpTest, LocalSgeOnUnmappedMemoryIsLocalProtectionError) {
  Pages pages;
  ASSERT_NE(pages.base, MAP_FAILED);
  ibv_mr* implicit = ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(implicit, nullptr);
  Buffer remote(dev.pd, 64);
  ibv_sge sge{pages.unmapped(), 64, implicit->lkey};
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma = {remote.addr(0), remote.rkey()};
  ibv_wc wc = run(wr);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << loopback::wc_str(wc);
  EXPECT_EQ(ibv_dereg_mr(implicit), 0);
}

// A receive WQE through the implicit lkey at an unmapped address: the SEND's
// data has nowhere to go (the responder's LOC_PROT_ERR, the requester's
// REM_OP_ERR), and nothing faults.
TEST_F(OdpTest, ReceiveIntoUnmappedMemoryFailsBothSides) {
  Pages pages;
  ASSERT_NE(pages.base, MAP_FAILED);
  ibv_mr* implicit = ibv_reg_mr(dev.pd, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(implicit, nullptr);
  ibv_sge rsge{pages.unmapped(), 64, implicit->lkey};
  ASSERT_EQ(loopback::post_recv(b, 7, &rsge, 1), 0);
  Buffer local(dev.pd, 64);
  ibv_sge sge = local.sge(0, 64);
  ibv_wc wc = run(loopback::make_wr(1, IBV_WR_SEND, &sge, 1));
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << loopback::wc_str(wc);
  ibv_wc rwc{};
  ASSERT_TRUE(loopback::poll_one(cq_b, &rwc));
  EXPECT_EQ(rwc.wr_id, 7u);
  EXPECT_EQ(rwc.status, IBV_WC_LOC_PROT_ERR) << loopback::wc_str(rwc);
  EXPECT_EQ(ibv_dereg_mr(implicit), 0);
}

// An explicit ODP MR whose owner made its pages inaccessible after
// registering it (here PROT_NONE; munmap is the same to a NIC): every use
// fails as with an implicit MR, as a WRITE into it, an atomic on it, a
// local SGE in it and a receive into it, and nothing faults. With the pages
// back, the same MR works again.
TEST_F(OdpTest, ExplicitMrOverPagesMadeInaccessibleFailsEveryUseUntilTheyReturn) {
  Pages pages;
  ASSERT_NE(pages.base, MAP_FAILED);
  ibv_mr* odp = ibv_reg_mr(dev.pd, pages.mapped(), 4096, kRemote | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(odp, nullptr) << "errno " << errno;
  ASSERT_EQ(mprotect(pages.mapped(), 4096, PROT_NONE), 0);
  Buffer local(dev.pd, 64);
  const uint64_t target = reinterpret_cast<uint64_t>(pages.mapped());
  ibv_sge sge = local.sge(0, 64);
  ibv_send_wr write = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  write.wr.rdma = {target, odp->rkey};
  ibv_wc wc = run(write);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  loopback::drain_async_events(dev.ctx);
  // The error moved both QPs to ERROR: fresh ones for each further case.
  auto reconnect = [&] {
    for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    a = loopback::create_qp(dev.pd, cq_a, cq_a, cfg);
    b = loopback::create_qp(dev.pd, cq_b, cq_b, cfg);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(loopback::bring_up(a, b->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(loopback::bring_up(b, a->qp_num, dev.gid, cfg), 0);
  };
  reconnect();
  ibv_sge word = local.sge(0, 8);
  ibv_send_wr atomic = loopback::make_wr(2, IBV_WR_ATOMIC_FETCH_AND_ADD, &word, 1);
  atomic.wr.atomic.remote_addr = target;
  atomic.wr.atomic.rkey = odp->rkey;
  atomic.wr.atomic.compare_add = 1;
  wc = run(atomic);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  loopback::drain_async_events(dev.ctx);
  reconnect();
  ibv_sge from_odp{target, 64, odp->lkey};
  ibv_send_wr out = loopback::make_wr(3, IBV_WR_RDMA_WRITE, &from_odp, 1);
  out.wr.rdma = {local.addr(0), local.rkey()};
  wc = run(out);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << loopback::wc_str(wc);
  loopback::drain_async_events(dev.ctx);
  reconnect();
  ASSERT_EQ(loopback::post_recv(b, 7, &from_odp, 1), 0);
  wc = run(loopback::make_wr(4, IBV_WR_SEND, &sge, 1));
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << loopback::wc_str(wc);
  ibv_wc rwc{};
  ASSERT_TRUE(loopback::poll_one(cq_b, &rwc));
  EXPECT_EQ(rwc.status, IBV_WC_LOC_PROT_ERR) << loopback::wc_str(rwc);
  loopback::drain_async_events(dev.ctx);
  reconnect();
  // The pages are back: the MR reaches them again.
  ASSERT_EQ(mprotect(pages.mapped(), 4096, PROT_READ | PROT_WRITE), 0);
  loopback::fill_pattern(local.span(0, 64), 9);
  wc = run(write);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  EXPECT_EQ(std::memcmp(pages.mapped(), local.span(0, 64).data(), 64), 0);
  EXPECT_EQ(ibv_dereg_mr(odp), 0);
}

TEST_F(OdpTest, AdviseMrRules) {
  Buffer odp(dev.pd, 4096, kRemote | IBV_ACCESS_ON_DEMAND), plain(dev.pd, 4096);
  ibv_sge good = odp.sge(0, 4096);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &good, 1), 0);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &good, 1), 0);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &good, 1), 0);
  // Not an on-demand MR, a range beyond the MR, no ranges, unknown flags.
  ibv_sge not_odp = plain.sge(0, 64);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_odp, 1), EINVAL);
  ibv_sge beyond{odp.addr(0), 8192, odp.lkey()};
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &beyond, 1), EINVAL);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &good, 0), EINVAL);
  EXPECT_EQ(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &good, 1), EINVAL);
  // An MR of another PD.
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &good, 1), EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

}  // namespace
