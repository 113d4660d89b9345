// The udp link's thread leaving the sockets to a busy-polling application
// thread (SOFTHCA_UDP_HANDOVER_US; ctest: udp.handover, in a network
// namespace, SOFTHCA_LINK=udp). After a stretch of polling the link's
// thread no longer watches the sockets; what must hold is that packets
// still reach their QP whichever way the application then waits: spinning
// on memory a peer writes (the link thread's look finds the polling
// stopped), sleeping on a completion channel (arming the CQ hands the
// sockets back), or polling again.
#include <poll.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "loopback.hpp"

namespace {

using namespace loopback;

constexpr uint32_t kSize = 8192;  // several packets at the loopback MTU

// Streams WRITEs from pair.a into `dst` and polls each completion, for at
// least `stretch`: a poller that keeps at it well past the setting.
void poll_for_a_while(QpPair& pair, Buffer& src, Buffer& dst, Millis stretch) {
  const auto until = Clock::now() + stretch;
  for (uint64_t i = 0; Clock::now() < until; ++i) {
    ibv_sge sge = src.sge(0, kSize);
    ibv_send_wr wr = make_wr(i, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
    auto sent = poll_n(pair.a_send_cq, 1);
    ASSERT_EQ(sent.size(), 1u) << "write " << i;
    ASSERT_EQ(sent[0].status, IBV_WC_SUCCESS) << "write " << i;
  }
}

class UdpHandover : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* setting = std::getenv("SOFTHCA_UDP_HANDOVER_US");
    ASSERT_TRUE(setting != nullptr && std::atoi(setting) > 0)
        << "run with SOFTHCA_UDP_HANDOVER_US set (ctest udp.handover)";
    stretch_ = Millis(std::atoi(setting) / 1000 * 20 + 20);
  }
  Millis stretch_{0};
};

TEST_F(UdpHandover, AWriteReachesAnApplicationThatStoppedPollingToSpinOnMemory) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, kSize);
  Buffer dst(dev.pd, kSize);
  for (int round = 0; round < 5; ++round) {
    std::memset(dst.data(), 0, kSize);
    fill_pattern({src.data(), kSize}, 100 + static_cast<uint64_t>(round));
    poll_for_a_while(pair, src, dst, stretch_);
    // The last write: its completion is not polled; the data is waited for
    // in memory, as ib_write_lat waits.
    std::memset(dst.data(), 0, kSize);
    fill_pattern({src.data(), kSize}, 200 + static_cast<uint64_t>(round));
    ibv_sge sge = src.sge(0, kSize);
    ibv_send_wr wr = make_wr(1'000'000, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
    const auto until = Clock::now() + kDeadline;
    const volatile unsigned char* last = static_cast<unsigned char*>(dst.data()) + kSize - 1;
    const unsigned char expected = static_cast<unsigned char*>(src.data())[kSize - 1];
    ASSERT_NE(expected, 0);
    while (*last != expected && Clock::now() < until) std::this_thread::yield();
    ASSERT_EQ(*last, expected) << "round " << round << ": the write never landed";
    // Its whole payload, then its completion.
    const auto whole = Clock::now() + kDeadline;
    while (first_mismatch({src.data(), kSize}, {dst.data(), kSize}) != -1 && Clock::now() < whole)
      std::this_thread::yield();
    EXPECT_EQ(first_mismatch({src.data(), kSize}, {dst.data(), kSize}), -1) << "round " << round;
    auto sent = poll_n(pair.a_send_cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  }
}

TEST_F(UdpHandover, ASendReachesAnApplicationThatArmedItsCqToSleep) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* channel = ibv_create_comp_channel(dev.ctx);
  ASSERT_NE(channel, nullptr);
  {
    QpConfig cfg;
    QpPair pair(dev, cfg, cfg, 256, channel);
    ASSERT_TRUE(pair.ok());
    Buffer src(dev.pd, kSize);
    Buffer dst(dev.pd, kSize);
    for (int round = 0; round < 5; ++round) {
      fill_pattern({src.data(), kSize}, 300 + static_cast<uint64_t>(round));
      poll_for_a_while(pair, src, dst, stretch_);
      // A pattern of its own: the data check must not pass on the writes' bytes.
      fill_pattern({src.data(), kSize}, 400 + static_cast<uint64_t>(round));
      ibv_sge rsge = dst.sge(0, kSize);
      ASSERT_EQ(post_recv(pair.b, static_cast<uint64_t>(round), &rsge, 1), 0);
      ASSERT_EQ(ibv_req_notify_cq(pair.b_recv_cq, 0), 0);
      ibv_sge ssge = src.sge(0, kSize);
      ibv_send_wr wr = make_wr(2'000'000, IBV_WR_SEND, &ssge, 1);
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
      // Sleeps on the channel: nobody polls the sockets now but the link's thread.
      ASSERT_TRUE(fd_readable(channel->fd, kDeadline)) << "round " << round << ": no completion event";
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      ASSERT_EQ(ibv_get_cq_event(channel, &cq, &context), 0);
      ASSERT_EQ(cq, pair.b_recv_cq);
      ibv_ack_cq_events(cq, 1);
      auto got = poll_n(pair.b_recv_cq, 1);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
      EXPECT_EQ(got[0].wr_id, static_cast<uint64_t>(round));
      EXPECT_EQ(first_mismatch({src.data(), kSize}, {dst.data(), kSize}), -1) << "round " << round;
      auto sent = poll_n(pair.a_send_cq, 1);
      ASSERT_EQ(sent.size(), 1u);
      EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
    }
  }
  ibv_destroy_comp_channel(channel);
}

}  // namespace
