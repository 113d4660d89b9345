// Many QPs in one process: 1000 RC QPs created, connected in pairs, one SEND
// each way, every message checked, everything destroyed.
#include <set>

#include "loopback.hpp"

namespace loopback {
namespace {

TEST(Scale, ThousandRcQps) {
  constexpr int kQps = 1000;
  constexpr int kPairs = kQps / 2;
  constexpr uint32_t kMsg = 64;
  const auto start = Clock::now();
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* send_cq = ibv_create_cq(dev.ctx, kQps + 8, nullptr, nullptr, 0);
  ibv_cq* recv_cq = ibv_create_cq(dev.ctx, kQps + 8, nullptr, nullptr, 0);
  ASSERT_NE(send_cq, nullptr);
  ASSERT_NE(recv_cq, nullptr);
  QpConfig cfg;
  cfg.max_send_wr = 2;
  cfg.max_recv_wr = 2;
  cfg.max_send_sge = 1;
  cfg.max_recv_sge = 1;
  std::vector<ibv_qp*> qps(kQps, nullptr);
  std::set<uint32_t> qpns;
  for (int i = 0; i < kQps; ++i) {
    qps[i] = create_qp(dev.pd, send_cq, recv_cq, cfg);
    ASSERT_NE(qps[i], nullptr) << "QP " << i << ": " << std::strerror(errno);
    qpns.insert(qps[i]->qp_num);
  }
  EXPECT_EQ(qpns.size(), size_t{kQps}) << "QPNs are not unique";
  auto peer_of = [&](int i) { return i < kPairs ? i + kPairs : i - kPairs; };
  for (int i = 0; i < kQps; ++i) ASSERT_EQ(bring_up(qps[i], qps[peer_of(i)]->qp_num, dev.gid, cfg), 0) << "QP " << i;

  {
    Buffer src(dev.pd, kQps * kMsg);
    Buffer dst(dev.pd, kQps * kMsg);
    fill_pattern(src.span(0, src.size()), 1000);
    // QP i receives into dst slot i and sends src slot i to its peer.
    for (int i = 0; i < kQps; ++i) {
      ibv_sge sge = dst.sge(i * kMsg, kMsg);
      ASSERT_EQ(post_recv(qps[i], i, &sge, 1), 0);
    }
    for (int i = 0; i < kQps; ++i) {
      ibv_sge sge = src.sge(i * kMsg, kMsg);
      ibv_send_wr wr = make_wr(i, IBV_WR_SEND, &sge, 1);
      ASSERT_EQ(post_send(qps[i], wr), 0) << "QP " << i;
    }
    auto sent = poll_n(send_cq, kQps, Millis{20000});
    auto received = poll_n(recv_cq, kQps, Millis{20000});
    ASSERT_EQ(sent.size(), size_t{kQps});
    ASSERT_EQ(received.size(), size_t{kQps});
    std::vector<int> seen(kQps, 0);
    for (const ibv_wc& wc : sent) {
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_LT(wc.wr_id, uint64_t{kQps});
      EXPECT_EQ(wc.qp_num, qps[wc.wr_id]->qp_num);
    }
    for (const ibv_wc& wc : received) {
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_LT(wc.wr_id, uint64_t{kQps});
      const int i = static_cast<int>(wc.wr_id);
      ++seen[i];
      EXPECT_EQ(wc.qp_num, qps[i]->qp_num);
      EXPECT_EQ(wc.src_qp, qps[peer_of(i)]->qp_num);
      EXPECT_EQ(wc.byte_len, kMsg);
      // QP i received what its peer sent.
      EXPECT_EQ(std::memcmp(dst.data() + i * kMsg, src.data() + peer_of(i) * kMsg, kMsg), 0) << "QP " << i;
    }
    for (int i = 0; i < kQps; ++i) EXPECT_EQ(seen[i], 1) << "QP " << i;
  }
  for (ibv_qp* qp : qps) ASSERT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(send_cq), 0);
  EXPECT_EQ(ibv_destroy_cq(recv_cq), 0);
  EXPECT_LT(Clock::now() - start, Millis{30000});
}

}  // namespace
}  // namespace loopback
