// The SEND lane (link/shm/send_lane.hpp): after a direct SEND into the
// peer QP's own receive queue, the next SENDs of the same shape are done
// from the top of ibv_post_send with what that SEND found. Every test here
// first arms the lane with plain SENDs, then changes one thing the lane
// relies on, or sends a shape it leaves to the general way, and checks that
// the outcome is the general path's: where the bytes land, the receive
// completion's fields, the sender's status.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "loopback.hpp"
#include "pages.hpp"

using namespace loopback;

namespace {

constexpr uint32_t kLen = 64;

// One signaled SEND from `qp` and its completion from `cq`.
ibv_wc send_and_complete(ibv_qp* qp, ibv_cq* cq, ibv_sge* sge, uint64_t wr_id, ibv_wr_opcode opcode = IBV_WR_SEND,
                         uint32_t imm = 0, unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr wr = make_wr(wr_id, opcode, sge, 1, flags);
  wr.imm_data = imm;
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(post_send(qp, wr), 0);
  EXPECT_TRUE(poll_one(cq, &wc));
  return wc;
}

// Plain SENDs of kLen bytes into receives of their own length at the start
// of `into`: the first arms the lane, the others take it.
void arm(QpPair& pair, Pages& local, Pages& into) {
  for (uint64_t id = 1; id <= 3; ++id) {
    fill_pattern(local.span(0, kLen), id);
    ibv_sge to = into.sge(0, kLen);
    ASSERT_EQ(post_recv(pair.b, 100 + id, &to, 1), 0);
    ibv_sge sge = local.sge(0, kLen);
    const ibv_wc wc = send_and_complete(pair.a, pair.a_send_cq, &sge, id);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    ibv_wc rwc{};
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
    ASSERT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    ASSERT_EQ(rwc.wr_id, 100 + id);
    ASSERT_EQ(first_mismatch(into.span(0, kLen), local.span(0, kLen)), -1) << id;
  }
}

}  // namespace

// Receives the lane does not take (a first SGE shorter than the message, an
// empty first SGE, another MR's key) land as the general path lands them,
// with its completion, and so do SENDs it does make with what they carry
// (immediate data, the solicited flag); a plain SEND after each is laned
// again and lands too.
TEST(SendLane, EveryShapeLandsAsTheGeneralPathLandsIt) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096), other(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok() && other.ok());
  arm(pair, local, remote);

  enum class Shape { kSplit, kEmptyFirst, kOtherKey, kImmediate, kSolicitedInline };
  uint64_t id = 10;
  for (const Shape shape : {Shape::kSplit, Shape::kEmptyFirst, Shape::kOtherKey, Shape::kImmediate,
                            Shape::kSolicitedInline}) {
    SCOPED_TRACE(static_cast<int>(shape));
    std::memset(remote.data(), 0, remote.size());
    std::memset(other.data(), 0, other.size());
    fill_pattern(local.span(0, kLen), id);
    ibv_sge sges[2];
    int nsge = 1;
    switch (shape) {
      case Shape::kSplit:  // 16 bytes at 1024, the rest at 2048
        sges[0] = remote.sge(1024, 16);
        sges[1] = remote.sge(2048, kLen);
        nsge = 2;
        break;
      case Shape::kEmptyFirst:
        sges[0] = remote.sge(512, 0);
        sges[1] = remote.sge(1024, kLen);
        nsge = 2;
        break;
      case Shape::kOtherKey:
        sges[0] = other.sge(256, kLen);
        break;
      case Shape::kImmediate:
      case Shape::kSolicitedInline:
        sges[0] = remote.sge(256, kLen);
        break;
    }
    ASSERT_EQ(post_recv(pair.b, id, sges, nsge), 0);
    ibv_sge sge = local.sge(0, kLen);
    const bool imm = shape == Shape::kImmediate;
    const unsigned flags = shape == Shape::kSolicitedInline ? IBV_SEND_SIGNALED | IBV_SEND_SOLICITED : IBV_SEND_SIGNALED;
    const ibv_wc wc = send_and_complete(pair.a, pair.a_send_cq, &sge, id, imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
                                        htonl(0xabc0u + static_cast<uint32_t>(id)), flags);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
    ibv_wc rwc{};
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
    EXPECT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    EXPECT_EQ(rwc.wr_id, id);
    EXPECT_EQ(rwc.opcode, IBV_WC_RECV);
    EXPECT_EQ(rwc.byte_len, kLen);
    EXPECT_EQ(rwc.qp_num, pair.b->qp_num);
    EXPECT_EQ(rwc.src_qp, pair.a->qp_num);
    EXPECT_EQ((rwc.wc_flags & IBV_WC_WITH_IMM) != 0, imm);
    if (imm) {
      EXPECT_EQ(rwc.imm_data, htonl(0xabc0u + static_cast<uint32_t>(id)));
    }
    switch (shape) {
      case Shape::kSplit:
        EXPECT_EQ(first_mismatch(remote.span(1024, 16), local.span(0, 16)), -1);
        EXPECT_EQ(first_mismatch(remote.span(2048, kLen - 16), local.span(16, kLen - 16)), -1);
        EXPECT_EQ(first_not(remote.span(2048 + kLen - 16, 16), 0), -1) << "past the message";
        break;
      case Shape::kEmptyFirst:
        EXPECT_EQ(first_not(remote.span(0, 1024), 0), -1) << "before the second SGE";
        EXPECT_EQ(first_mismatch(remote.span(1024, kLen), local.span(0, kLen)), -1);
        break;
      case Shape::kOtherKey:
        EXPECT_EQ(first_mismatch(other.span(256, kLen), local.span(0, kLen)), -1);
        EXPECT_EQ(first_not(remote.span(0, remote.size()), 0), -1) << "the lane's MR";
        break;
      case Shape::kImmediate:
      case Shape::kSolicitedInline:
        EXPECT_EQ(first_mismatch(remote.span(256, kLen), local.span(0, kLen)), -1);
        break;
    }
    ++id;
    // And the plain shape again, into the lane's MR.
    std::memset(remote.data(), 0, remote.size());
    fill_pattern(local.span(0, kLen), id);
    ibv_sge to = remote.sge(0, kLen);
    ASSERT_EQ(post_recv(pair.b, id, &to, 1), 0);
    ASSERT_EQ(send_and_complete(pair.a, pair.a_send_cq, &sge, id).status, IBV_WC_SUCCESS);
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
    EXPECT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    EXPECT_EQ(rwc.wr_id, id);
    EXPECT_EQ(rwc.wc_flags, 0u);
    EXPECT_EQ(first_mismatch(remote.span(0, kLen), local.span(0, kLen)), -1);
    ++id;
  }
}

// A SEND that finds no receive WQE waits for one (RNR, retried without
// end): it lands in the receive posted after it, not in a consumed WQE's
// slot that the lane read before.
TEST(SendLane, ASendWithoutAReceiveLandsInTheNextOnePosted) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 7;  // without end
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, local, remote);
  std::memset(remote.data(), 0, remote.size());
  fill_pattern(local.span(0, kLen), 77);
  ibv_sge sge = local.sge(0, kLen);
  ibv_send_wr wr = make_wr(7, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(pair.a_send_cq, 1, &wc), 0) << "completed with no receive posted";
  EXPECT_EQ(first_not(remote.span(0, remote.size()), 0), -1) << "landed with no receive posted";
  ibv_sge to = remote.sge(1024, kLen);
  ASSERT_EQ(post_recv(pair.b, 70, &to, 1), 0);
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ibv_wc rwc{};
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
  EXPECT_EQ(rwc.wr_id, 70u);
  EXPECT_EQ(first_mismatch(remote.span(1024, kLen), local.span(0, kLen)), -1);
  EXPECT_EQ(first_not(remote.span(0, 1024), 0), -1);
}

// The receive MR is deregistered while a receive that names it is posted:
// the SEND is refused as the responder refuses it (the receiver's
// LOC_PROT_ERR, the sender's REM_OP_ERR), and nothing lands in the memory.
TEST(SendLane, AReceiveKeyDeregisteredIsJudgedAgain) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 0;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Pages local(dev.pd, 4096), remote(dev.pd, 4096);
  ASSERT_TRUE(local.ok() && remote.ok());
  arm(pair, local, remote);
  std::memset(remote.data(), 0, remote.size());
  ibv_sge to = remote.sge(0, kLen);
  ASSERT_EQ(post_recv(pair.b, 9, &to, 1), 0);
  ASSERT_EQ(remote.dereg(), 0);
  ibv_sge sge = local.sge(0, kLen);
  const ibv_wc wc = send_and_complete(pair.a, pair.a_send_cq, &sge, 9);
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << wc_str(wc);
  ibv_wc rwc{};
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
  EXPECT_EQ(rwc.status, IBV_WC_LOC_PROT_ERR) << wc_str(rwc);
  EXPECT_EQ(first_not(remote.span(0, remote.size()), 0), -1);
  drain_async_events(dev.ctx);
}

// The receiving QP stops receiving: moved to the error state (its posted
// receive flushed), or reset and brought back to INIT only, with a receive
// posted there. The next SEND lands nowhere: the responder takes nothing
// in either state, and the requester retries, then gives up.
TEST(SendLane, AReceiverThatStoppedReceivingTakesNothing) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  for (const ibv_qp_state state : {IBV_QPS_ERR, IBV_QPS_INIT}) {
    SCOPED_TRACE(state);
    QpConfig cfg;
    cfg.timeout = 8;  // 1 ms
    cfg.retry_cnt = 1;
    QpPair pair(dev, cfg);
    ASSERT_TRUE(pair.ok());
    Pages local(dev.pd, 4096), remote(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && remote.ok());
    arm(pair, local, remote);
    std::memset(remote.data(), 0, remote.size());
    ibv_sge to = remote.sge(0, kLen);
    ibv_wc rwc{};
    if (state == IBV_QPS_ERR) {
      ASSERT_EQ(post_recv(pair.b, 5, &to, 1), 0);
      ibv_qp_attr err{};
      err.qp_state = IBV_QPS_ERR;
      ASSERT_EQ(ibv_modify_qp(pair.b, &err, IBV_QP_STATE), 0);
      ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc));
      EXPECT_EQ(rwc.status, IBV_WC_WR_FLUSH_ERR) << wc_str(rwc);
    } else {
      ibv_qp_attr reset{};
      reset.qp_state = IBV_QPS_RESET;
      ASSERT_EQ(ibv_modify_qp(pair.b, &reset, IBV_QP_STATE), 0);
      ASSERT_EQ(qp_to_init(pair.b, cfg), 0);
      ASSERT_EQ(post_recv(pair.b, 5, &to, 1), 0);
    }
    ibv_sge sge = local.sge(0, kLen);
    const ibv_wc wc = send_and_complete(pair.a, pair.a_send_cq, &sge, 5);
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
    EXPECT_EQ(first_not(remote.span(0, remote.size()), 0), -1);
    EXPECT_EQ(ibv_poll_cq(pair.b_recv_cq, 1, &rwc), 0);
    drain_async_events(dev.ctx);
  }
}

// The lane stands for the peer its QP reached: reset and connected to
// another peer, the QP's next SEND lands in that peer's receive, and the
// first peer's posted receive stays untouched.
TEST(SendLane, AQpConnectedAgainSendsToItsNewPeer) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const QpConfig cfg;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  ibv_cq* c_cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(c_cq, nullptr);
  ibv_qp* c = create_qp(dev.pd, c_cq, c_cq, cfg);
  ASSERT_NE(c, nullptr);
  {
    Pages local(dev.pd, 4096), remote(dev.pd, 4096), at_c(dev.pd, 4096);
    ASSERT_TRUE(local.ok() && remote.ok() && at_c.ok());
    arm(pair, local, remote);
    std::memset(remote.data(), 0, remote.size());
    ibv_sge to_b = remote.sge(0, kLen), to_c = at_c.sge(0, kLen);
    ASSERT_EQ(post_recv(pair.b, 20, &to_b, 1), 0);
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(pair.a, &reset, IBV_QP_STATE), 0);
    ASSERT_EQ(bring_up(pair.a, c->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(bring_up(c, pair.a->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(post_recv(c, 30, &to_c, 1), 0);
    fill_pattern(local.span(0, kLen), 31);
    ibv_sge sge = local.sge(0, kLen);
    ASSERT_EQ(send_and_complete(pair.a, pair.a_send_cq, &sge, 31).status, IBV_WC_SUCCESS);
    ibv_wc rwc{};
    ASSERT_TRUE(poll_one(c_cq, &rwc));
    EXPECT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    EXPECT_EQ(rwc.wr_id, 30u);
    EXPECT_EQ(rwc.qp_num, c->qp_num);
    EXPECT_EQ(first_mismatch(at_c.span(0, kLen), local.span(0, kLen)), -1);
    EXPECT_EQ(first_not(remote.span(0, remote.size()), 0), -1) << "the SEND went to the first peer";
    EXPECT_EQ(ibv_poll_cq(pair.b_recv_cq, 1, &rwc), 0);
  }
  EXPECT_EQ(ibv_destroy_qp(c), 0);
  EXPECT_EQ(ibv_destroy_cq(c_cq), 0);
}

// Two senders whose receivers share an SRQ, each with its lane armed, take
// the SRQ's WQEs in turn, lap after lap: each SEND lands in the WQE it
// took, with the receiving QP's completion, and every polled completion
// frees its slot (a slot never freed would refuse a post, ENOMEM; one freed
// twice would let the SRQ take more than it holds).
TEST(SendLane, SendersToOneSrqTakeItsWqesInTurn) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  constexpr uint32_t kDepth = 16;
  ibv_srq_init_attr srq_init{};
  srq_init.attr.max_wr = kDepth;
  srq_init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(dev.pd, &srq_init);
  ASSERT_NE(srq, nullptr);
  ibv_cq* send_cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ibv_cq* recv_cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(send_cq != nullptr && recv_cq != nullptr);
  const QpConfig cfg;
  ibv_qp* senders[2] = {create_qp(dev.pd, send_cq, send_cq, cfg), create_qp(dev.pd, send_cq, send_cq, cfg)};
  ibv_qp* receivers[2] = {create_qp(dev.pd, send_cq, recv_cq, cfg, srq), create_qp(dev.pd, send_cq, recv_cq, cfg, srq)};
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(senders[s] != nullptr && receivers[s] != nullptr);
    ASSERT_EQ(bring_up(senders[s], receivers[s]->qp_num, dev.gid, cfg), 0);
    ASSERT_EQ(bring_up(receivers[s], senders[s]->qp_num, dev.gid, cfg), 0);
  }
  {
    Pages local(dev.pd, 4096), remote(dev.pd, kDepth * 256);
    ASSERT_TRUE(local.ok() && remote.ok());
    uint64_t id = 0;
    for (int lap = 0; lap < 4; ++lap) {
      SCOPED_TRACE(lap);
      std::memset(remote.data(), 0, remote.size());
      const uint64_t first = id;
      for (uint32_t w = 0; w < kDepth; ++w) ASSERT_EQ(post_srq_recv(srq, first + w, remote.sge(256 * w, kLen)), 0);
      for (uint32_t w = 0; w < kDepth; ++w, ++id) {
        const int s = static_cast<int>(w % 2);
        fill_pattern(local.span(kLen * w % 4096, kLen), id);
        ibv_sge sge = local.sge(kLen * w % 4096, kLen);
        ASSERT_EQ(send_and_complete(senders[s], send_cq, &sge, id).status, IBV_WC_SUCCESS);
        ibv_wc rwc{};
        ASSERT_TRUE(poll_one(recv_cq, &rwc));
        EXPECT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
        EXPECT_EQ(rwc.wr_id, id) << "the SRQ's WQEs are taken in order";
        EXPECT_EQ(rwc.qp_num, receivers[s]->qp_num);
        EXPECT_EQ(rwc.src_qp, senders[s]->qp_num);
        EXPECT_EQ(first_mismatch(remote.span(256 * w, kLen), local.span(kLen * w % 4096, kLen)), -1) << w;
      }
    }
  }
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(ibv_destroy_qp(senders[s]), 0);
    EXPECT_EQ(ibv_destroy_qp(receivers[s]), 0);
  }
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(send_cq), 0);
  EXPECT_EQ(ibv_destroy_cq(recv_cq), 0);
}
