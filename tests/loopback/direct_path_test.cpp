// RC WRITE and READ of one local range, to a peer on this host, complete on
// the spot (the engine's direct path) while every check of the responder
// passes; the moment one does not, the operation must end exactly as the
// general responder ends it. These tests take the direct path first, then
// change what it relies on between two operations of the same connection,
// and check the second outcome: status, the responder QP's state and event,
// and the bytes.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>

#include "loopback.hpp"
#include "pages.hpp"

using namespace loopback;

namespace {

constexpr uint32_t kLen = 64;

ibv_send_wr rdma_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sge, uint64_t remote_addr, uint32_t rkey,
                    unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr wr = make_wr(wr_id, opcode, sge, 1, flags);
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  return wr;
}

// One signaled operation from a to b's memory; its completion.
ibv_wc run_one(QpPair& pair, ibv_send_wr wr) {
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(post_send(pair.a, wr), 0);
  EXPECT_TRUE(poll_one(pair.a_send_cq, &wc));
  return wc;
}

}  // namespace

TEST(DirectPath, WriteAndReadMoveTheBytes) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  fill_pattern(local.span(0, kLen), 1);
  ibv_sge sge = local.sge(0, kLen);
  ibv_wc wc = run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(100), remote.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(first_mismatch(remote.span(100, kLen), local.span(0, kLen)), -1);
  EXPECT_EQ(first_not(remote.span(0, 100), 0), -1);
  EXPECT_EQ(first_not(remote.span(100 + kLen, 4096 - 100 - kLen), 0), -1);

  fill_pattern(remote.span(1000, kLen), 2);
  ibv_sge into = local.sge(2000, kLen);
  wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_READ, &into, remote.addr(1000), remote.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc.byte_len, kLen);
  EXPECT_EQ(first_mismatch(local.span(2000, kLen), remote.span(1000, kLen)), -1);
}

// Inline data is taken when the WR is posted: the buffer may change at once.
TEST(DirectPath, InlineWriteTakesTheBytesAtPost) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_inline_data = 64;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Pages remote(dev.pd, 4096);
  uint8_t bytes[32];
  std::memset(bytes, 0x5a, sizeof bytes);
  ibv_sge sge{reinterpret_cast<uint64_t>(bytes), sizeof bytes, 0};
  ibv_send_wr wr = rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(8), remote.rkey(), IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  std::memset(bytes, 0xa5, sizeof bytes);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_not(remote.span(8, 32), 0x5a), -1);
}

// The first message that reaches a QP in RTR raises COMM_EST, WRITE or READ
// alike, and only once.
TEST(DirectPath, FirstWriteToRtrRaisesCommEstablished) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* b = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(qp_to_init(b, cfg), 0);
  ASSERT_EQ(qp_to_rtr(b, a->qp_num, dev.gid, cfg), 0);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    fill_pattern(local.span(0, kLen), 3);
    ibv_sge sge = local.sge(0, kLen);
    for (uint64_t i = 0; i < 3; ++i) {
      ibv_send_wr wr = rdma_wr(i, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey());
      ASSERT_EQ(post_send(a, wr), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      if (i == 0) {
        decltype(ibv_async_event::element) element{};
        ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_COMM_EST, &element));
        EXPECT_EQ(element.qp, b);
      }
    }
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{20}));
    EXPECT_EQ(first_mismatch(remote.span(0, kLen), local.span(0, kLen)), -1);
  }
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// The responder QP's access flags change under an established connection:
// the next WRITE (READ) is refused as the responder refuses it, its QP going
// to ERROR with an access error event, and nothing lands.
class AccessRevoked : public testing::TestWithParam<ibv_wr_opcode> {};

TEST_P(AccessRevoked, NextOperationGetsRemoteAccessError) {
  const ibv_wr_opcode opcode = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  fill_pattern(local.span(0, kLen), 4);
  ibv_sge sge = local.sge(0, kLen);
  ibv_wc wc = run_one(pair, rdma_wr(1, opcode, &sge, remote.addr(), remote.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);

  ibv_qp_attr attr{};
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;  // neither remote write nor read
  ASSERT_EQ(ibv_modify_qp(pair.b, &attr, IBV_QP_ACCESS_FLAGS), 0);
  fill_pattern(local.span(0, kLen), 5);
  std::vector<uint8_t> before(remote.data(), remote.data() + remote.size());
  wc = run_one(pair, rdma_wr(2, opcode, &sge, remote.addr(), remote.rkey()));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
  EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
  EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
  decltype(ibv_async_event::element) element{};
  ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, &element));
  EXPECT_EQ(element.qp, pair.b);
  EXPECT_EQ(first_mismatch(remote.span(0, remote.size()), before), -1);
}

INSTANTIATE_TEST_SUITE_P(WriteAndRead, AccessRevoked, testing::Values(IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ));

// The WRITE lane (link/shm/memory_lane.hpp) stands for the peer its QP
// reached: reset and connected to another peer, the QP's next WRITE goes to
// that one, which judges the key in its own PD (another PD here:
// REM_ACCESS_ERR), and nothing lands in the first peer's memory, which the
// key would still open.
TEST(DirectPath, AQpConnectedAgainWritesToItsNewPeer) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* other_pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other_pd, nullptr);
  ibv_cq* a_cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_cq* peer_cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(a_cq != nullptr && peer_cq != nullptr);
  const QpConfig cfg;
  ibv_qp* a = create_qp(dev.pd, a_cq, a_cq, cfg);
  ibv_qp* b = create_qp(dev.pd, peer_cq, peer_cq, cfg);
  ibv_qp* c = create_qp(other_pd, peer_cq, peer_cq, cfg);
  ASSERT_TRUE(a != nullptr && b != nullptr && c != nullptr);
  ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(bring_up(b, a->qp_num, dev.gid, cfg), 0);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && remote.ok());
    ibv_sge sge = local.sge(0, 8);
    ibv_wc wc{};
    for (uint64_t id = 1; id <= 3; ++id) {  // the first arms the lane, the others take it
      fill_pattern(local.span(0, 8), static_cast<uint8_t>(id));
      ibv_send_wr wr = rdma_wr(id, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey());
      ASSERT_EQ(post_send(a, wr), 0);
      ASSERT_TRUE(poll_one(a_cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_EQ(first_mismatch(remote.span(0, 8), std::vector<uint8_t>(local.data(), local.data() + 8)), -1);
    }
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(a, &reset, IBV_QP_STATE), 0);
    ASSERT_EQ(bring_up(a, c->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(bring_up(c, a->qp_num, dev.gid, cfg), 0);
    const std::vector<uint8_t> before(remote.data(), remote.data() + remote.size());
    fill_pattern(local.span(0, 8), 9);
    ibv_send_wr wr = rdma_wr(4, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey());
    ASSERT_EQ(post_send(a, wr), 0);
    ASSERT_TRUE(poll_one(a_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
    EXPECT_EQ(first_mismatch(remote.span(0, remote.size()), before), -1) << "the WRITE went to the first peer";
  }
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_qp(c), 0);
  EXPECT_EQ(ibv_destroy_cq(a_cq), 0);
  EXPECT_EQ(ibv_destroy_cq(peer_cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
}

// The target MR is deregistered between two WRITEs: the second gets
// REM_ACCESS_ERR and its bytes land nowhere.
TEST(DirectPath, WriteAfterDeregistrationIsRefused) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), target(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && target.ok());
  const uint32_t rkey = target.rkey();
  fill_pattern(local.span(0, kLen), 6);
  ibv_sge sge = local.sge(0, kLen);
  ibv_wc wc = run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, target.addr(), rkey));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(target.span(0, kLen), local.span(0, kLen)), -1);

  ASSERT_EQ(target.dereg(), 0);
  const std::vector<uint8_t> before(target.data(), target.data() + target.size());
  fill_pattern(local.span(0, kLen), 7);
  wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_WRITE, &sge, target.addr(), rkey));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
  EXPECT_EQ(first_mismatch(target.span(0, target.size()), before), -1);
}

// The direct path keeps what a key granted while the key's registry slot
// stands (link::KeyGrant): a key changed in place between two operations
// with the same keys is judged anew. Here ibv_rereg_mr drops the target's
// remote write (the rkey stays), then the local MR's local write under a
// READ into it.
TEST(DirectPath, KeysChangedInPlaceAreJudgedAgain) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), target(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && target.ok());
    ibv_sge sge = local.sge(0, kLen);
    const uint32_t rkey = target.rkey();
    for (uint64_t id = 1; id <= 3; ++id)  // the key's grant is kept from the first on
      ASSERT_EQ(run_one(pair, rdma_wr(id, IBV_WR_RDMA_WRITE, &sge, target.addr(), rkey)).status, IBV_WC_SUCCESS);
    ASSERT_EQ(ibv_rereg_mr(target.mr(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
              0);
    ASSERT_EQ(target.rkey(), rkey);
    fill_pattern(local.span(0, kLen), 8);
    const std::vector<uint8_t> before(target.data(), target.data() + target.size());
    const ibv_wc wc = run_one(pair, rdma_wr(4, IBV_WR_RDMA_WRITE, &sge, target.addr(), rkey));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
    EXPECT_EQ(first_mismatch(target.span(0, target.size()), before), -1);
    drain_async_events(dev.ctx);
  }
  {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), target(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && target.ok());
    fill_pattern(target.span(0, kLen), 9);
    ibv_sge sge = local.sge(0, kLen);
    for (uint64_t id = 1; id <= 3; ++id)
      ASSERT_EQ(run_one(pair, rdma_wr(id, IBV_WR_RDMA_READ, &sge, target.addr(), target.rkey())).status,
                IBV_WC_SUCCESS);
    ASSERT_EQ(ibv_rereg_mr(local.mr(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_READ), 0);
    sge.lkey = local.mr()->lkey;
    std::memset(local.data(), 0, kLen);
    const ibv_wc wc = run_one(pair, rdma_wr(4, IBV_WR_RDMA_READ, &sge, target.addr(), target.rkey()));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
    EXPECT_EQ(first_not(local.span(0, kLen), 0), -1);
    drain_async_events(dev.ctx);
  }
}

// A range one byte past the MR, and a READ to a QP without responder
// resources, after a WRITE that went through.
TEST(DirectPath, BadRangeAndNoReadResourcesAnswerAsTheResponder) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ibv_sge sge = local.sge(0, kLen);
    ASSERT_EQ(run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey())).status,
              IBV_WC_SUCCESS);
    const ibv_wc wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_WRITE, &sge, remote.addr(4096 - kLen + 1), remote.rkey()));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
    drain_async_events(dev.ctx);
  }
  {
    QpConfig responder;
    responder.max_dest_rd_atomic = 0;
    QpPair pair(dev, QpConfig{}, responder);
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ibv_sge sge = local.sge(0, kLen);
    ASSERT_EQ(run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey())).status,
              IBV_WC_SUCCESS);
    const ibv_wc wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_READ, &sge, remote.addr(), remote.rkey()));
    EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
    drain_async_events(dev.ctx);
  }
}

// Keys that do not grant the operation, after one that did: an MR without
// remote write, an MR of another PD, a window narrower than its MR.
TEST(DirectPath, KeysThatDoNotGrantAnswerRemoteAccessError) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    Pages read_only(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    Pages foreign(other, 4096);
    Pages windowed(dev.pd, 4096, Buffer::kAllAccess | IBV_ACCESS_MW_BIND);
    ASSERT_TRUE(local.ok() && remote.ok() && read_only.ok() && foreign.ok() && windowed.ok());
    ibv_sge sge = local.sge(0, kLen);
    struct Case {
      const char* what;
      uint64_t addr;
      uint32_t rkey;
    };
    std::vector<Case> cases = {{"an MR without remote write", read_only.addr(), read_only.rkey()},
                               {"an MR of another PD", foreign.addr(), foreign.rkey()}};
    // A type 1 window over bytes [1024, 2048) of its MR, and a WRITE that
    // ends one byte past it (inside the MR).
    ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_1);
    ASSERT_NE(mw, nullptr);
    QpPair binder(dev, QpConfig{});
    ASSERT_TRUE(binder.ok());
    ibv_mw_bind bind{};
    bind.wr_id = 9;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = windowed.mr();
    bind.bind_info.addr = windowed.addr(1024);
    bind.bind_info.length = 1024;
    bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(ibv_bind_mw(binder.a, mw, &bind), 0);
    ibv_wc bound{};
    ASSERT_TRUE(poll_one(binder.a_send_cq, &bound));
    ASSERT_EQ(bound.status, IBV_WC_SUCCESS) << wc_str(bound);
    cases.push_back({"a range one byte past a window", windowed.addr(2048 - kLen + 1), mw->rkey});
    for (const Case& c : cases) {
      QpPair pair(dev, QpConfig{});
      ASSERT_TRUE(pair.ok());
      ASSERT_EQ(run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey())).status,
                IBV_WC_SUCCESS);
      const ibv_wc wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_WRITE, &sge, c.addr, c.rkey));
      EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << c.what << ": " << wc_str(wc);
      drain_async_events(dev.ctx);
    }
    EXPECT_EQ(first_not(read_only.span(0, 4096), 0), -1);
    EXPECT_EQ(first_not(foreign.span(0, 4096), 0), -1);
    EXPECT_EQ(first_not(windowed.span(0, 4096), 0), -1);
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  }
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// A local SGE the QP's PD does not own is a local protection error, as
// before, and a READ into memory registered without local write too.
TEST(DirectPath, LocalKeyChecksStay) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    Pages foreign(other, 4096), remote(dev.pd, 4096);
    ibv_sge sge = foreign.sge(0, kLen);
    const ibv_wc wc = run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey()));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  }
  {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    Pages read_only(dev.pd, 4096, IBV_ACCESS_REMOTE_READ), remote(dev.pd, 4096);
    ibv_sge sge = read_only.sge(0, kLen);
    const ibv_wc wc = run_one(pair, rdma_wr(1, IBV_WR_RDMA_READ, &sge, remote.addr(), remote.rkey()));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  }
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// Operations that complete at once still hold their send queue slot until
// a completion retires it: unsignaled ones fill the queue (ENOMEM), as on
// hardware, and every byte they carried landed.
TEST(DirectPath, UnsignaledWritesStillFillTheSendQueue) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 16;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.a).max_send_wr;
  ASSERT_GT(depth, 0u);
  Pages local(dev.pd, 4096), remote(dev.pd, 4096 * 8);
  fill_pattern(local.span(0, 4096), 8);
  uint32_t posted = 0;
  for (; posted < depth + 1; ++posted) {
    ibv_sge sge = local.sge(posted % 64 * 8, 8);
    ibv_send_wr wr = rdma_wr(posted, IBV_WR_RDMA_WRITE, &sge, remote.addr(posted * 8), remote.rkey(), 0);
    const int rc = post_send(pair.a, wr);
    if (rc != 0) {
      EXPECT_EQ(rc, ENOMEM);
      break;
    }
  }
  EXPECT_EQ(posted, depth);
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{10}));
  for (uint32_t i = 0; i < posted; ++i)
    EXPECT_EQ(first_mismatch(remote.span(i * 8, 8), local.span(i % 64 * 8, 8)), -1) << "write " << i;
}

// Longer than one fence chunk (1 MiB): the general path, chunk by chunk.
TEST(DirectPath, LongWritesAndReadsStillArriveWhole) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  constexpr uint32_t kBig = 3 << 20;
  Pages local(dev.pd, kBig), remote(dev.pd, kBig), back(dev.pd, kBig);
  fill_pattern(local.span(0, kBig), 9);
  ibv_sge sge = local.sge(0, kBig);
  ASSERT_EQ(run_one(pair, rdma_wr(1, IBV_WR_RDMA_WRITE, &sge, remote.addr(), remote.rkey())).status, IBV_WC_SUCCESS);
  ibv_sge into = back.sge(0, kBig);
  const ibv_wc wc = run_one(pair, rdma_wr(2, IBV_WR_RDMA_READ, &into, remote.addr(), remote.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.byte_len, kBig);
  EXPECT_EQ(first_mismatch(back.span(0, kBig), local.span(0, kBig)), -1);
}

namespace {

ibv_send_wr atomic_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sge, uint64_t remote_addr, uint32_t rkey,
                      uint64_t compare_add, uint64_t swap = 0) {
  ibv_send_wr wr = make_wr(wr_id, opcode, sge, 1);
  wr.wr.atomic.remote_addr = remote_addr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  return wr;
}

uint64_t word_at(Pages& pages, size_t offset) {
  uint64_t v = 0;
  std::memcpy(&v, pages.data() + offset, sizeof v);
  return v;
}

}  // namespace

// Fetch-and-add and compare-and-swap: the original value lands in the local
// SGE, the word changes once, a failed compare leaves it alone.
TEST(DirectPath, AtomicsReturnTheOriginalAndChangeTheWordOnce) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  const uint64_t start = 0x1000000000000005;
  std::memcpy(remote.data() + 64, &start, sizeof start);
  ibv_sge sge = local.sge(0, 8);
  for (uint64_t i = 0; i < 4; ++i) {
    const ibv_wc wc = run_one(pair, atomic_wr(i, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, remote.addr(64), remote.rkey(), 3));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_FETCH_ADD);
    EXPECT_EQ(wc.byte_len, 8u);
    EXPECT_EQ(word_at(local, 0), start + 3 * i);
  }
  EXPECT_EQ(word_at(remote, 64), start + 12);
  ibv_wc wc = run_one(pair, atomic_wr(9, IBV_WR_ATOMIC_CMP_AND_SWP, &sge, remote.addr(64), remote.rkey(), 1, 7));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(word_at(local, 0), start + 12);
  EXPECT_EQ(word_at(remote, 64), start + 12);  // the compare failed
  wc = run_one(pair, atomic_wr(10, IBV_WR_ATOMIC_CMP_AND_SWP, &sge, remote.addr(64), remote.rkey(), start + 12, 7));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(word_at(local, 0), start + 12);
  EXPECT_EQ(word_at(remote, 64), 7u);
}

// After an atomic that went through: a misaligned word, an MR without
// remote atomic access and a 4-byte local SGE end as the general path ends
// them.
TEST(DirectPath, AtomicErrorsAnswerAsTheResponder) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  Pages no_atomic(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(local.ok() && remote.ok() && no_atomic.ok());
  struct Case {
    const char* what;
    uint64_t addr;
    uint32_t rkey;
    uint32_t local_length;
    ibv_wc_status status;
  };
  const Case cases[] = {
      {"a misaligned word", remote.addr(68), remote.rkey(), 8, IBV_WC_REM_INV_REQ_ERR},
      {"an MR without remote atomic access", no_atomic.addr(64), no_atomic.rkey(), 8, IBV_WC_REM_ACCESS_ERR},
      {"a 4-byte local SGE", remote.addr(64), remote.rkey(), 4, IBV_WC_LOC_LEN_ERR},
  };
  for (const Case& c : cases) {
    QpPair pair(dev, QpConfig{});
    ASSERT_TRUE(pair.ok());
    ibv_sge sge = local.sge(0, 8);
    ASSERT_EQ(run_one(pair, atomic_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, remote.addr(64), remote.rkey(), 1)).status,
              IBV_WC_SUCCESS);
    const uint64_t before = word_at(remote, 64);
    sge.length = c.local_length;
    const ibv_wc wc = run_one(pair, atomic_wr(2, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, c.addr, c.rkey, 1));
    EXPECT_EQ(wc.status, c.status) << c.what << ": " << wc_str(wc);
    EXPECT_EQ(word_at(remote, 64), before) << c.what;
    EXPECT_EQ(word_at(no_atomic, 64), 0u) << c.what;
    drain_async_events(dev.ctx);
  }
}

namespace {

// One SEND from a, with its completion; the receive completion is b's to poll.
ibv_wc send_one(QpPair& pair, ibv_sge* sge, uint64_t wr_id, ibv_wr_opcode opcode = IBV_WR_SEND, uint32_t imm = 0) {
  ibv_send_wr wr = make_wr(wr_id, opcode, sge, 1);
  wr.imm_data = imm;
  return run_one(pair, wr);
}

}  // namespace

// A SEND keeps what its receive SGE's lkey granted while the key's registry
// slot stands (link::receive_grant), checked over the whole SGE: after SENDs
// that made the grant, a receive one byte past the MR (the SEND itself
// shorter) and then the MR changed in place to drop local write (its lkey
// stays) are each refused as the responder refuses them, and nothing lands.
TEST(DirectPath, ReceiveKeysChangedInPlaceAreJudgedAgain) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  for (const bool change_access : {false, true}) {
    QpConfig cfg;
    cfg.rnr_retry = 0;
    QpPair pair(dev, cfg);
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && remote.ok());
    ibv_sge sge = local.sge(0, kLen);
    ibv_wc rwc{};
    for (uint64_t id = 1; id <= 3; ++id) {  // the receive key's grant is kept from the first on
      ibv_sge into = remote.sge(4096 - 2 * kLen, 2 * kLen);
      ASSERT_EQ(post_recv(pair.b, id, &into, 1), 0);
      ASSERT_EQ(send_one(pair, &sge, id).status, IBV_WC_SUCCESS);
      ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
      ASSERT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    }
    std::memset(remote.data(), 0, 4096);
    fill_pattern(local.span(0, kLen), 11);
    ibv_sge into = remote.sge(4096 - 2 * kLen, 2 * kLen + 1);  // one byte past the MR
    if (change_access) {
      const uint32_t lkey = remote.mr()->lkey;
      ASSERT_EQ(ibv_rereg_mr(remote.mr(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_READ), 0);
      ASSERT_EQ(remote.mr()->lkey, lkey);
      into = remote.sge(4096 - 2 * kLen, 2 * kLen);
    }
    ASSERT_EQ(post_recv(pair.b, 9, &into, 1), 0);
    const ibv_wc wc = send_one(pair, &sge, 9);
    EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << wc_str(wc);
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
    EXPECT_EQ(rwc.status, IBV_WC_LOC_PROT_ERR) << wc_str(rwc);
    EXPECT_EQ(first_not(remote.span(0, 4096), 0), -1) << (change_access ? "access dropped" : "past the MR");
    drain_async_events(dev.ctx);
  }
}

// SENDs land in the receive WQEs in order, across their SGEs, with the
// completion the general path writes (wr_id, length, source QP, immediate).
TEST(DirectPath, SendsFillReceiveWqesInOrder) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  for (uint64_t i = 0; i < 4; ++i) {
    // 16 bytes at 512 * i, then 48 more at 512 * i + 256.
    ibv_sge into[2] = {remote.sge(512 * i, 16), remote.sge(512 * i + 256, 48)};
    ASSERT_EQ(post_recv(pair.b, 100 + i, into, 2), 0);
  }
  for (uint64_t i = 0; i < 4; ++i) {
    fill_pattern(local.span(64 * i, kLen), 20 + i);
    ibv_sge sge = local.sge(64 * i, kLen);
    const ibv_wc wc = i % 2 ? send_one(pair, &sge, i, IBV_WR_SEND_WITH_IMM, htonl(0x1234 + i)) : send_one(pair, &sge, i);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  }
  const auto wcs = poll_n(pair.b_recv_cq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    const ibv_wc& wc = wcs[i];
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, 100 + i);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, kLen);
    EXPECT_EQ(wc.qp_num, pair.b->qp_num);
    EXPECT_EQ(wc.src_qp, pair.a->qp_num);
    if (i % 2) {
      EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(wc.imm_data, htonl(0x1234 + i));
    } else {
      EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM);
    }
    EXPECT_EQ(first_mismatch(remote.span(512 * i, 16), local.span(64 * i, 16)), -1) << i;
    EXPECT_EQ(first_mismatch(remote.span(512 * i + 256, 48), local.span(64 * i + 16, 48)), -1) << i;
    EXPECT_EQ(first_not(remote.span(512 * i + 16, 240), 0), -1) << i;
  }
}

// A direct SEND's completion tells the receiver which WQE it took, and
// polling it frees that slot without reading the queue's tail: lap after
// lap the receive queue takes max_recv_wr WQEs again (a slot never freed
// would refuse one with ENOMEM, one freed twice would take one more), mixed
// with flushed WQEs and across a reset, and the position never shows
// through as vendor_err.
TEST(DirectPath, PolledReceivesFreeTheirSlotsLapAfterLap) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_recv_wr = 4;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.b).max_recv_wr;
  ASSERT_GE(depth, 4u);
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  uint64_t next_id = 0;
  auto fill_queue = [&] {
    for (uint32_t i = 0; i < depth; ++i) {
      ibv_sge into = remote.sge(0, kLen);
      ASSERT_EQ(post_recv(pair.b, next_id++, &into, 1), 0) << "receive " << i << " of " << depth;
    }
    // ... and no more: a slot freed twice would take one.
    ibv_sge into = remote.sge(0, kLen);
    ASSERT_EQ(post_recv(pair.b, 999, &into, 1), ENOMEM);
  };
  for (int lap = 0; lap < 5; ++lap) {
    fill_queue();
    for (uint32_t i = 0; i < depth; ++i) {
      fill_pattern(local.span(0, kLen), 40 + lap * 8 + i);
      ibv_sge sge = local.sge(0, kLen);
      const ibv_wc wc = send_one(pair, &sge, i);
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    }
    const auto wcs = poll_n(pair.b_recv_cq, depth);
    ASSERT_EQ(wcs.size(), depth);
    for (const ibv_wc& wc : wcs) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      EXPECT_EQ(wc.vendor_err, 0u);
    }
    EXPECT_EQ(first_mismatch(remote.span(0, kLen), local.span(0, kLen)), -1) << "lap " << lap;
  }
  // Half the queue taken by SENDs, half flushed by the error; all polled.
  fill_queue();
  for (uint32_t i = 0; i < depth / 2; ++i) {
    ibv_sge sge = local.sge(0, kLen);
    ASSERT_EQ(send_one(pair, &sge, i).status, IBV_WC_SUCCESS);
  }
  ibv_qp_attr to_error{};
  to_error.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(pair.b, &to_error, IBV_QP_STATE), 0);
  const auto mixed = poll_n(pair.b_recv_cq, depth);
  ASSERT_EQ(mixed.size(), depth);
  for (uint32_t i = 0; i < depth; ++i) {
    EXPECT_EQ(mixed[i].status, i < depth / 2 ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR) << i;
    EXPECT_EQ(mixed[i].vendor_err, 0u) << i;
  }
  // Both QPs reset and connected again: a full queue again, and SENDs into it.
  ibv_qp_attr to_reset{};
  to_reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(pair.a, &to_reset, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(pair.b, &to_reset, IBV_QP_STATE), 0);
  ASSERT_EQ(bring_up(pair.a, pair.b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(bring_up(pair.b, pair.a->qp_num, dev.gid, cfg), 0);
  for (int lap = 0; lap < 2; ++lap) {
    fill_queue();
    for (uint32_t i = 0; i < depth; ++i) {
      ibv_sge sge = local.sge(0, kLen);
      const ibv_wc wc = send_one(pair, &sge, i);
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    }
    ASSERT_EQ(poll_n(pair.b_recv_cq, depth).size(), depth);
  }
}

// After a SEND that went through: no receive WQE (RNR, rnr_retry 0), a
// receive WQE too short, and one whose SGE names another PD's MR end as the
// general responder ends them, the receiver's QP in ERROR for the last two.
TEST(DirectPath, SendErrorsAnswerAsTheResponder) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096), foreign(other, 4096);
    ASSERT_TRUE(local.ok() && remote.ok() && foreign.ok());
    ibv_sge sge = local.sge(0, kLen);
    enum class Case { kNoReceive, kTooShort, kOtherPd };
    for (const Case c : {Case::kNoReceive, Case::kTooShort, Case::kOtherPd}) {
      QpConfig cfg;
      cfg.rnr_retry = 0;
      cfg.max_recv_wr = 4;
      QpPair pair(dev, cfg);
      ASSERT_TRUE(pair.ok());
      // Round the receive ring more than once, so that the slot at its tail
      // holds a consumed WQE, which must not be taken for a posted one.
      ibv_wc rwc{};
      for (uint64_t i = 0; i < 9; ++i) {
        ibv_sge first = remote.sge(0, kLen);
        ASSERT_EQ(post_recv(pair.b, 1, &first, 1), 0);
        ASSERT_EQ(send_one(pair, &sge, 1).status, IBV_WC_SUCCESS);
        ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
        ASSERT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
      }
      ibv_sge into = c == Case::kTooShort ? remote.sge(1024, kLen - 1) : foreign.sge(0, kLen);
      if (c != Case::kNoReceive) {
        ASSERT_EQ(post_recv(pair.b, 2, &into, 1), 0);
      }
      const ibv_wc wc = send_one(pair, &sge, 2);
      switch (c) {
        case Case::kNoReceive:
          EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << wc_str(wc);
          EXPECT_EQ(qp_state(pair.b), IBV_QPS_RTS);
          break;
        case Case::kTooShort:
          EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
          ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
          EXPECT_EQ(rwc.status, IBV_WC_LOC_LEN_ERR) << wc_str(rwc);
          EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
          break;
        case Case::kOtherPd:
          EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << wc_str(wc);
          ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
          EXPECT_EQ(rwc.status, IBV_WC_LOC_PROT_ERR) << wc_str(rwc);
          EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
          break;
      }
      EXPECT_EQ(first_not(foreign.span(0, 4096), 0), -1);
      drain_async_events(dev.ctx);
    }
  }
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// UC: WRITEs and SENDs succeed at once; a SEND that finds no receive WQE is
// dropped (the requester still completes it, as UC does).
TEST(DirectPath, UnreliableConnectedWritesAndSends) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.type = IBV_QPT_UC;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  for (uint64_t i = 0; i < 3; ++i) {
    fill_pattern(local.span(0, kLen), 30 + i);
    ibv_sge sge = local.sge(0, kLen);
    const ibv_wc wc = run_one(pair, rdma_wr(i, IBV_WR_RDMA_WRITE, &sge, remote.addr(128 * i), remote.rkey()));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(first_mismatch(remote.span(128 * i, kLen), local.span(0, kLen)), -1) << i;
  }
  ibv_sge into = remote.sge(2048, kLen);
  ASSERT_EQ(post_recv(pair.b, 7, &into, 1), 0);
  ibv_sge sge = local.sge(0, kLen);
  for (uint64_t i = 0; i < 2; ++i) {
    const ibv_wc wc = send_one(pair, &sge, 10 + i);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  }
  const auto wcs = poll_n(pair.b_recv_cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(first_mismatch(remote.span(2048, kLen), local.span(0, kLen)), -1);
  EXPECT_TRUE(stays_empty(pair.b_recv_cq, Millis{10}));  // the second SEND found no WQE
  EXPECT_EQ(qp_state(pair.b), IBV_QPS_RTS);
}

// SENDs to a QP with an SRQ take its WQEs; once the SRQ is armed with a
// limit, the SEND that takes it below the limit raises SRQ_LIMIT_REACHED.
TEST(DirectPath, SendsIntoAnSrqAndItsLimit) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_srq_init_attr srq_init{};
  srq_init.attr.max_wr = 16;
  srq_init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(dev.pd, &srq_init);
  ASSERT_NE(srq, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(cq && rcq);
  QpConfig cfg;
  ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* b = create_qp(dev.pd, cq, rcq, cfg, srq);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(bring_up(b, a->qp_num, dev.gid, cfg), 0);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && remote.ok());
    for (uint64_t i = 0; i < 8; ++i) {
      ibv_sge into = remote.sge(256 * i, kLen);
      ibv_recv_wr wr{};
      wr.wr_id = 50 + i;
      wr.sg_list = &into;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
    }
    auto send = [&](uint64_t i) {
      fill_pattern(local.span(0, kLen), 40 + i);
      ibv_sge sge = local.sge(0, kLen);
      ibv_send_wr wr = make_wr(i, IBV_WR_SEND, &sge, 1);
      ASSERT_EQ(post_send(a, wr), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_TRUE(poll_one(rcq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      EXPECT_EQ(wc.wr_id, 50 + i);
      EXPECT_EQ(wc.byte_len, kLen);
      EXPECT_EQ(first_mismatch(remote.span(256 * i, kLen), local.span(0, kLen)), -1) << i;
    };
    for (uint64_t i = 0; i < 4; ++i) send(i);
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0}));
    // 4 WQEs left; armed at 3: the next SEND leaves 3, not below; the one
    // after leaves 2 and raises the event, once.
    ibv_srq_attr attr{};
    attr.srq_limit = 3;
    ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
    send(4);
    send(5);
    decltype(ibv_async_event::element) element{};
    ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &element));
    EXPECT_EQ(element.srq, srq);
    send(6);
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{20}));
  }
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

// Inline data in several SGEs (one of them empty, at address 0) arrives
// concatenated, as UCX's active messages send a header and a payload.
TEST(DirectPath, InlineSendGathersItsSges) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_inline_data = 128;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Pages remote(dev.pd, 4096);
  ASSERT_TRUE(remote.ok());
  uint8_t header[8], payload[40];
  for (int round = 0; round < 2; ++round) {  // the first message goes the general way
    ibv_sge into = remote.sge(512 * round, 128);
    ASSERT_EQ(post_recv(pair.b, 60 + round, &into, 1), 0);
    std::memset(header, 0x11 + round, sizeof header);
    fill_pattern(std::span<uint8_t>(payload, sizeof payload), 70 + round);
    ibv_sge sges[3] = {{reinterpret_cast<uint64_t>(header), sizeof header, 0},
                       {0, 0, 0},
                       {reinterpret_cast<uint64_t>(payload), sizeof payload, 0}};
    ibv_send_wr wr = make_wr(round, IBV_WR_SEND, sges, 3, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    ASSERT_EQ(post_send(pair.a, wr), 0);
    std::memset(payload, 0, sizeof payload);  // taken at post
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.byte_len, sizeof header + sizeof payload);
    EXPECT_EQ(first_not(remote.span(512 * round, sizeof header), 0x11 + round), -1);
    fill_pattern(std::span<uint8_t>(payload, sizeof payload), 70 + round);
    EXPECT_EQ(first_mismatch(remote.span(512 * round + sizeof header, sizeof payload),
                             std::span<const uint8_t>(payload, sizeof payload)),
              -1);
  }
}

// The receive queue's marks under real concurrency: one thread keeps b's
// queue topped up, re-posting each WQE as soon as its completion is polled,
// while another sends a numbered stream one SEND at a time. The queue runs
// empty now and then (those SENDs go the general way, RNR and retry) and
// laps many times; every message must land whole in the WQE of its number,
// in order, and in the end the queue must hold exactly its depth again (no
// slot lost, none freed twice).
TEST(DirectPath, SendsRaceTheReceiversPostsAndPolls) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_recv_wr = 1;  // one WQE: the sender often finds the queue empty
  cfg.rnr_retry = 7;    // an empty queue waits, it does not fail
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.b).max_recv_wr;
  ASSERT_GE(depth, 1u);
  constexpr uint64_t kMessages = 20000;
  constexpr uint32_t kSlot = 64;
  // Whole pages: the direct path's (see Pages).
  Pages local(dev.pd, 4096), remote(dev.pd, (depth * kSlot + 4095) / 4096 * 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  auto post_slot = [&](uint64_t n) {
    ibv_sge into = remote.sge((n % depth) * kSlot, kSlot);
    return post_recv(pair.b, n, &into, 1);
  };
  for (uint64_t n = 0; n < depth; ++n) ASSERT_EQ(post_slot(n), 0);
  std::atomic<uint64_t> received{0};
  std::atomic<bool> receiver_failed{false};
  std::string receiver_error;
  std::thread receiver([&] {
    const auto until = Clock::now() + std::chrono::seconds(60);
    uint64_t next_post = depth;
    for (uint64_t expected = 0; expected < kMessages;) {
      ibv_wc wc{};
      const int got = ibv_poll_cq(pair.b_recv_cq, 1, &wc);
      if (got == 0) {
        if (Clock::now() > until) {
          receiver_error = "no completion for message " + std::to_string(expected);
          break;
        }
        continue;
      }
      if (got < 0 || wc.status != IBV_WC_SUCCESS || wc.wr_id != expected || wc.byte_len != kSlot ||
          wc.vendor_err != 0) {
        receiver_error = "message " + std::to_string(expected) + ": " + wc_str(wc);
        break;
      }
      uint64_t number = 0;
      std::memcpy(&number, remote.data() + (expected % depth) * kSlot, sizeof number);
      if (number != expected) {
        receiver_error = "WQE " + std::to_string(expected) + " holds message " + std::to_string(number);
        break;
      }
      ++expected;
      received.store(expected, std::memory_order_release);
      if (const int rc = post_slot(next_post++); rc != 0) {
        receiver_error = "post_recv: " + std::to_string(rc);
        break;
      }
    }
    receiver_failed.store(!receiver_error.empty());
  });
  for (uint64_t i = 0; i < kMessages && !receiver_failed.load(); ++i) {
    std::memcpy(local.data(), &i, sizeof i);
    std::memset(local.data() + sizeof i, static_cast<int>(i & 0xff), kSlot - sizeof i);
    ibv_sge sge = local.sge(0, kSlot);
    const ibv_wc wc = send_one(pair, &sge, i);
    if (wc.status != IBV_WC_SUCCESS) {
      ADD_FAILURE() << "SEND " << i << ": " << wc_str(wc);
      break;
    }
  }
  receiver.join();
  ASSERT_TRUE(receiver_error.empty()) << receiver_error;
  EXPECT_EQ(received.load(), kMessages);
  // Every WQE polled was posted again: the queue is full, and refuses one more.
  EXPECT_EQ(post_slot(kMessages + depth), ENOMEM);
}
