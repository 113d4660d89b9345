// A QP moved to SQD while its sends are on the wire (ctest: udp.sqd_drain,
// in a network namespace, SOFTHCA_LINK=udp, every packet held back 1 to
// 20 ms by the fault link): the send queue reports draining until the sends
// it had started are done, then drained; they complete successfully.
// rdma_disconnect relies on it to let sends under way finish before the QP
// goes to ERROR (abi/rdmacm/qp.cpp).
#include <chrono>
#include <cstdlib>

#include "loopback.hpp"

namespace {

using namespace loopback;

int sq_draining(ibv_qp* qp, ibv_qp_state& state) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) != 0) return -1;
  state = attr.qp_state;
  return attr.sq_draining;
}

TEST(UdpSqdDrain, TheSendQueueDrainsOnceTheSendsOnTheWireAreDone) {
  ASSERT_NE(std::getenv("SOFTHCA_FAULT"), nullptr) << "run with SOFTHCA_FAULT holding packets back (ctest udp.sqd_drain)";
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  constexpr int kWrites = 4;
  constexpr uint32_t kSize = 16 * 1024;
  Buffer src(dev.pd, kWrites * kSize);
  Buffer dst(dev.pd, kWrites * kSize);
  fill_pattern({src.data(), src.size()}, 31);
  for (int i = 0; i < kWrites; ++i) {
    ibv_sge sge = src.sge(i * kSize, kSize);
    ibv_send_wr wr = make_wr(static_cast<uint64_t>(i), IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = dst.addr() + i * kSize;
    wr.wr.rdma.rkey = dst.rkey();
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  ASSERT_EQ(ibv_modify_qp(pair.a, &attr, IBV_QP_STATE), 0);
  ibv_qp_state state{};
  EXPECT_EQ(sq_draining(pair.a, state), 1) << "the WRITEs are held back on the wire";
  EXPECT_EQ(state, IBV_QPS_SQD);
  auto sent = poll_n(pair.a_send_cq, kWrites);
  ASSERT_EQ(sent.size(), static_cast<size_t>(kWrites));
  for (const ibv_wc& wc : sent) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(sq_draining(pair.a, state), 0) << "drained once every WRITE it had started is done";
  EXPECT_EQ(first_mismatch({src.data(), src.size()}, {dst.data(), dst.size()}), -1);
  // Drained, it goes to ERROR (rdma_disconnect) with nothing left to flush.
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(pair.a, &attr, IBV_QP_STATE), 0);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(pair.a_send_cq, 1, &wc), 0);
}

}  // namespace
