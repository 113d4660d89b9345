// The memory lane (link/shm/memory_lane.hpp): after a direct WRITE or READ,
// the next ones of one SGE are done from the top of ibv_post_send with the
// target and the key's grant that operation found. These tests arm it
// with a few operations (the first of a connection goes the general way,
// which raises COMM_EST), then change what a READ relies on and check the
// outcome is the general path's: the status, and no byte read.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "loopback.hpp"
#include "pages.hpp"

using namespace loopback;

namespace {

constexpr uint32_t kLen = 64;

// One signaled WRITE or READ of kLen bytes between local[0] and remote's
// `addr` under `rkey`, and its completion.
ibv_wc one_sided(QpPair& pair, ibv_wr_opcode opcode, Pages& local, uint64_t addr, uint32_t rkey, uint64_t wr_id) {
  ibv_sge sge = local.sge(0, kLen);
  ibv_send_wr wr = make_wr(wr_id, opcode, &sge, 1);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(post_send(pair.a, wr), 0);
  EXPECT_TRUE(poll_one(pair.a_send_cq, &wc));
  return wc;
}

// Three operations of `opcode` that succeed: the first raises COMM_EST the
// general way, the second arms the lane, the third takes it.
void arm(QpPair& pair, ibv_wr_opcode opcode, Pages& local, uint64_t addr, uint32_t rkey) {
  for (uint64_t id = 1; id <= 3; ++id) {
    const ibv_wc wc = one_sided(pair, opcode, local, addr, rkey, id);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  }
  drain_async_events(pair.a->context);
}

// A READ of remote's first kLen bytes under `rkey` that must end in
// `status` and bring nothing: local keeps what it held.
void expect_read_refused(QpPair& pair, Pages& local, Pages& remote, uint32_t rkey, ibv_wc_status status) {
  fill_pattern(remote.span(0, kLen), 5);
  fill_pattern(local.span(0, kLen), 6);
  const ibv_wc wc = one_sided(pair, IBV_WR_RDMA_READ, local, remote.addr(), rkey, 9);
  EXPECT_EQ(wc.status, status) << wc_str(wc);
  std::vector<uint8_t> held(kLen);
  fill_pattern(held, 6);
  EXPECT_EQ(first_mismatch(local.span(0, kLen), held), -1) << "a refused READ brought bytes";
  drain_async_events(pair.a->context);
}

}  // namespace

// Every laned READ brings the bytes there are now, changed between READs.
TEST(MemoryLane, ReadsBringTheBytesOfTheirMoment) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, IBV_WR_RDMA_READ, local, remote.addr(512), remote.rkey());
  for (uint64_t round = 0; round < 4; ++round) {
    fill_pattern(remote.span(512, kLen), 30 + round);
    const ibv_wc wc = one_sided(pair, IBV_WR_RDMA_READ, local, remote.addr(512), remote.rkey(), 10 + round);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc.byte_len, kLen);
    EXPECT_EQ(first_mismatch(local.span(0, kLen), remote.span(512, kLen)), -1) << round;
  }
}

// The responder QP stops granting remote read (remote write stays): the
// next READ is refused as the responder refuses it, and brings nothing.
TEST(MemoryLane, AReadAfterRemoteReadIsRevokedIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, IBV_WR_RDMA_READ, local, remote.addr(), remote.rkey());
  ibv_qp_attr attr{};
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(pair.b, &attr, IBV_QP_ACCESS_FLAGS), 0);
  expect_read_refused(pair, local, remote, remote.rkey(), IBV_WC_REM_ACCESS_ERR);
}

// A responder without resources for READs (max_dest_rd_atomic 0), reached
// by WRITEs that armed the lane: the READ is an invalid request, and
// brings nothing.
TEST(MemoryLane, AReadWithoutResponderResourcesIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig responder;
  responder.max_dest_rd_atomic = 0;
  QpPair pair(dev, QpConfig{}, responder);
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, IBV_WR_RDMA_WRITE, local, remote.addr(), remote.rkey());
  expect_read_refused(pair, local, remote, remote.rkey(), IBV_WC_REM_INV_REQ_ERR);
}

// A key that grants remote write but not remote read, whose grant the
// lane keeps from the WRITEs: a READ under it is refused, and brings
// nothing.
TEST(MemoryLane, AReadUnderAWriteOnlyKeyIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, IBV_WR_RDMA_WRITE, local, remote.addr(), remote.rkey());
  expect_read_refused(pair, local, remote, remote.rkey(), IBV_WC_REM_ACCESS_ERR);
}

// The remote MR is deregistered after the lane was armed with its key:
// the next READ is refused (REM_ACCESS_ERR) and reads nothing of the
// memory, which is still mapped.
TEST(MemoryLane, AReadAfterTheKeyIsDeregisteredIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  const uint32_t rkey = remote.rkey();
  arm(pair, IBV_WR_RDMA_READ, local, remote.addr(), rkey);
  ASSERT_EQ(remote.dereg(), 0);
  expect_read_refused(pair, local, remote, rkey, IBV_WC_REM_ACCESS_ERR);
}
