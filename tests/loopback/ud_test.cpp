// UD between two QPs of one process: the 40-byte GRH at the head of every
// receive buffer, IBV_WC_GRH and src_qp in the completion, Q_Key filtering
// (silent drop), the MTU limit, and replying through ibv_create_ah_from_wc.
#include <cstdlib>

#include "common/limits.hpp"
#include "loopback.hpp"

namespace loopback {
namespace {

constexpr uint32_t kGrh = softhca::limits::kUdGrhBytes;

QpConfig ud_config() {
  QpConfig cfg;
  cfg.type = IBV_QPT_UD;
  cfg.qkey = 0x1234ABCD;
  return cfg;
}

ibv_ah* make_ah(Device& dev) {
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.grh.dgid = dev.gid;
  attr.grh.sgid_index = 0;
  attr.grh.hop_limit = 64;
  attr.port_num = 1;
  return ibv_create_ah(dev.pd, &attr);
}

struct UdSetup {
  Device dev;
  QpPair pair{dev, ud_config()};
  ibv_ah* ah = make_ah(dev);
  ~UdSetup() {
    if (ah) ibv_destroy_ah(ah);
  }
  bool ok() const { return dev.ok() && pair.ok() && ah != nullptr; }

  // A UD send of the SGEs from a to b with Q_Key `qkey`.
  int send(ibv_sge* sges, int num_sge, uint64_t wr_id, uint32_t qkey, ibv_wr_opcode opcode = IBV_WR_SEND,
           uint32_t imm = 0) {
    ibv_send_wr wr = make_wr(wr_id, opcode, sges, num_sge);
    wr.imm_data = imm;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = pair.b->qp_num;
    wr.wr.ud.remote_qkey = qkey;
    return post_send(pair.a, wr);
  }
};

class UdData : public ::testing::TestWithParam<uint32_t> {};

TEST_P(UdData, GrhThenPayload) {
  const uint32_t n = GetParam();
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer src(s.dev.pd, n + 16);
  Buffer dst(s.dev.pd, kGrh + n + 64, Buffer::kAllAccess, 0xEE);
  fill_pattern(src.span(0, n), 40 + n);
  // Receive: GRH in its own SGE, the payload split over two more.
  ibv_sge rsges[3] = {dst.sge(0, kGrh), dst.sge(kGrh, n / 2), dst.sge(kGrh + n / 2, n - n / 2 + 64)};
  ASSERT_EQ(post_recv(s.pair.b, 21, rsges, 3), 0);
  ibv_sge sges[2] = {src.sge(0, n / 3), src.sge(n / 3, n - n / 3)};
  ASSERT_EQ(s.send(sges, 2, 22, s.pair.cfg_b.qkey, IBV_WR_SEND_WITH_IMM, htonl(0xFEED)), 0);

  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  EXPECT_EQ(wc.wr_id, 22u);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.wr_id, 21u);
  EXPECT_EQ(wc.byte_len, kGrh + n);
  EXPECT_EQ(wc.qp_num, s.pair.b->qp_num);
  EXPECT_EQ(wc.src_qp, s.pair.a->qp_num);
  EXPECT_NE(wc.wc_flags & IBV_WC_GRH, 0u);
  EXPECT_NE(wc.wc_flags & IBV_WC_WITH_IMM, 0u);
  EXPECT_EQ(wc.imm_data, htonl(0xFEED));
  EXPECT_EQ(first_mismatch(dst.span(kGrh, n), src.span(0, n)), -1);
  EXPECT_EQ(first_not(dst.span(kGrh + n, 64), 0xEE), -1);

  // GID 0 is 127.0.0.1 (IPv4-mapped): the GRH holds 20 unused bytes, then an IPv4 header.
  const uint8_t* grh = dst.data();
  ASSERT_EQ(s.dev.gid.raw[10], 0xff);
  EXPECT_EQ(grh[20], 0x45);  // IPv4, 20-byte header
  EXPECT_EQ(grh[29], 17);    // UDP
  EXPECT_EQ(std::memcmp(grh + 32, s.dev.gid.raw + 12, 4), 0);  // source address
  EXPECT_EQ(std::memcmp(grh + 36, s.dev.gid.raw + 12, 4), 0);  // destination address
}

// 1024: the smallest active MTU of a port on a 1500-byte Ethernet (and the
// largest UD message it carries); lo alone gives 4096.
INSTANTIATE_TEST_SUITE_P(Sizes, UdData, ::testing::Values(0u, 1u, 7u, 1000u, 1024u));

// What a UD receive reports in wc.sl on a RoCE port: mlx5 puts the network
// header type of the datagram there (2: IPv4, 1: IPv6), and UCX's ud_verbs
// reads it to find the destination address in the GRH area. It must agree
// with the header the receive buffer got.
uint8_t header_type_in(const uint8_t* grh) { return (grh[20] >> 4) == 4 ? 2 : 1; }

// Sends `n` bytes from a to b through an AH from sgid_index to dgid, with a
// flow label of all ones; the receive lands in `dst` (GRH first).
void send_through(UdSetup& s, Buffer& dst, uint8_t sgid_index, const ibv_gid& dgid, ibv_wc& wc) {
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.grh.dgid = dgid;
  attr.grh.sgid_index = sgid_index;
  attr.grh.hop_limit = 64;
  attr.grh.flow_label = 0xFFFFFFFF;  // as UCX fills it: taken, and 20 bits kept
  attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(s.dev.pd, &attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  ibv_sge rsge = dst.sge(0, kGrh + 16);
  ASSERT_EQ(post_recv(s.pair.b, 7, &rsge, 1), 0);
  ibv_sge sge = dst.sge(kGrh + 32, 16);
  ibv_send_wr wr = make_wr(8, IBV_WR_SEND, &sge, 1);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = s.pair.b->qp_num;
  wr.wr.ud.remote_qkey = s.pair.cfg_b.qkey;
  ASSERT_EQ(post_send(s.pair.a, wr), 0);
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ibv_destroy_ah(ah);
}

TEST(Ud, ServiceLevelIsTheNetworkHeaderType) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer dst(s.dev.pd, kGrh + 64);
  // GID 0 is IPv4-mapped (127.0.0.1): an IPv4 header, and sl 2.
  ibv_wc wc{};
  ASSERT_NO_FATAL_FAILURE(send_through(s, dst, 0, s.dev.gid, wc));
  EXPECT_EQ(dst.data()[20], 0x45);
  EXPECT_EQ(wc.sl, 2);
  EXPECT_EQ(wc.sl, header_type_in(dst.data()));

  // An IPv6 GID of this host, where it has one (::1 and the interfaces'
  // addresses): an IPv6 header with the flow label's 20 bits, and sl 1.
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(s.dev.ctx, 1, &port), 0);
  for (int i = 1; i < port.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(s.dev.ctx, 1, i, &gid) != 0) continue;
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const ibv_gid zero{};
    if (std::memcmp(&gid, &zero, sizeof gid) == 0 || std::memcmp(gid.raw, kMapped, 12) == 0) continue;
    SCOPED_TRACE("IPv6 GID index " + std::to_string(i));
    std::memset(dst.data(), 0, kGrh);
    ASSERT_NO_FATAL_FAILURE(send_through(s, dst, static_cast<uint8_t>(i), gid, wc));
    EXPECT_EQ(dst.data()[0] >> 4, 6);
    // Through shared memory the GRH carries the AH's flow label (its 20
    // bits). The udp link's packets leave through a UDP socket, whose IPv6
    // header the kernel writes without the AH's label, so there is none to
    // compare with.
    const char* link = std::getenv("SOFTHCA_LINK");
    if (link == nullptr || std::strcmp(link, "udp") != 0) {
      uint32_t vtf;
      std::memcpy(&vtf, dst.data(), 4);
      EXPECT_EQ(ntohl(vtf) & 0xFFFFF, 0xFFFFFu);
    }
    EXPECT_EQ(wc.sl, 1);
    EXPECT_EQ(wc.sl, header_type_in(dst.data()));
    break;
  }
}

TEST(Ud, WrongQkeyIsDroppedSilently) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer src(s.dev.pd, 64);
  Buffer dst(s.dev.pd, kGrh + 64);
  ibv_sge rsge = dst.sge(0, kGrh + 64);
  ASSERT_EQ(post_recv(s.pair.b, 1, &rsge, 1), 0);
  ibv_sge sge = src.sge(0, 16);
  ASSERT_EQ(s.send(&sge, 1, 2, s.pair.cfg_b.qkey + 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "a UD sender never learns of a drop";
  EXPECT_TRUE(stays_empty(s.pair.b_recv_cq, Millis{20}));
  EXPECT_EQ(qp_state(s.pair.b), IBV_QPS_RTS);
  // The receive is still there for a message with the right Q_Key.
  ASSERT_EQ(s.send(&sge, 1, 3, s.pair.cfg_b.qkey), 0);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.byte_len, kGrh + 16);
}

TEST(Ud, QkeyWithHighBitUsesTheSendersQkey) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer buf(s.dev.pd, kGrh + 64);
  ibv_sge rsge = buf.sge(0, kGrh + 16);
  ASSERT_EQ(post_recv(s.pair.b, 1, &rsge, 1), 0);
  ibv_sge sge = buf.sge(kGrh + 32, 16);
  ASSERT_EQ(s.send(&sge, 1, 2, 0x80000000u), 0);  // a's own Q_Key, which equals b's
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST(Ud, LargerThanMtuIsLocalLengthError) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(s.dev.ctx, 1, &port), 0);
  const uint32_t n = (128u << port.active_mtu) + 1;
  Buffer src(s.dev.pd, n);
  Buffer dst(s.dev.pd, kGrh + n);
  ibv_sge rsge = dst.sge(0, kGrh + n);
  ASSERT_EQ(post_recv(s.pair.b, 1, &rsge, 1), 0);
  ibv_sge sge = src.sge(0, n);
  ASSERT_EQ(s.send(&sge, 1, 2, s.pair.cfg_b.qkey), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_TRUE(stays_empty(s.pair.b_recv_cq, Millis{10}));
}

TEST(Ud, ReceiveBufferWithoutRoomForGrhIsLocalLengthError) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer buf(s.dev.pd, 256);
  ibv_sge rsge = buf.sge(0, 32);  // the message fits, the GRH in front of it does not
  ASSERT_EQ(post_recv(s.pair.b, 1, &rsge, 1), 0);
  ibv_sge sge = buf.sge(128, 16);
  ASSERT_EQ(s.send(&sge, 1, 2, s.pair.cfg_b.qkey), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << wc_str(wc);
}

// b answers a through an AH built from the completion and GRH it received.
TEST(Ud, AhFromWcCanReply) {
  UdSetup s;
  ASSERT_TRUE(s.ok());
  Buffer a_buf(s.dev.pd, kGrh + 64);
  Buffer b_buf(s.dev.pd, kGrh + 64);
  ibv_sge a_recv = a_buf.sge(0, kGrh + 64);
  ASSERT_EQ(post_recv(s.pair.a, 31, &a_recv, 1), 0);
  ibv_sge b_recv = b_buf.sge(0, kGrh + 64);
  ASSERT_EQ(post_recv(s.pair.b, 32, &b_recv, 1), 0);
  std::memcpy(a_buf.data() + kGrh, "ping", 4);
  ibv_sge sge = a_buf.sge(kGrh, 4);
  ASSERT_EQ(s.send(&sge, 1, 1, s.pair.cfg_b.qkey), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.pair.b_recv_cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_NE(wc.wc_flags & IBV_WC_GRH, 0u);

  ibv_ah_attr attr{};
  ASSERT_EQ(ibv_init_ah_from_wc(s.dev.ctx, 1, &wc, reinterpret_cast<ibv_grh*>(b_buf.data()), &attr), 0);
  EXPECT_EQ(attr.is_global, 1);
  EXPECT_EQ(std::memcmp(attr.grh.dgid.raw, s.dev.gid.raw, 16), 0);
  ibv_ah* reply_ah = ibv_create_ah_from_wc(s.dev.pd, &wc, reinterpret_cast<ibv_grh*>(b_buf.data()), 1);
  ASSERT_NE(reply_ah, nullptr) << std::strerror(errno);
  std::memcpy(b_buf.data() + kGrh, "pong", 4);
  ibv_sge rsge = b_buf.sge(kGrh, 4);
  ibv_send_wr wr = make_wr(2, IBV_WR_SEND, &rsge, 1);
  wr.wr.ud.ah = reply_ah;
  wr.wr.ud.remote_qpn = wc.src_qp;
  wr.wr.ud.remote_qkey = s.pair.cfg_a.qkey;
  ASSERT_EQ(post_send(s.pair.b, wr), 0);
  ASSERT_TRUE(poll_one(s.pair.b_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_one(s.pair.a_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 31u);
  EXPECT_EQ(wc.src_qp, s.pair.b->qp_num);
  EXPECT_EQ(wc.byte_len, kGrh + 4);
  EXPECT_EQ(std::memcmp(a_buf.data() + kGrh, "pong", 4), 0);
  EXPECT_EQ(ibv_destroy_ah(reply_ah), 0);
}

// One UD QP reaches several destinations, and one destination hears several sources.
TEST(Ud, OneQpManyPeers) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg = ud_config();
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qps[3];
  for (auto*& qp : qps) {
    qp = create_qp(dev.pd, cq, cq, cfg);
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(bring_up(qp, 0, dev.gid, cfg), 0);
  }
  ibv_ah* ah = make_ah(dev);
  ASSERT_NE(ah, nullptr);
  Buffer buf(dev.pd, 4096);
  for (int i = 0; i < 3; ++i) {
    ibv_sge rsge = buf.sge(i * 256, 256);
    ASSERT_EQ(post_recv(qps[i], 100 + i, &rsge, 1), 0);
    ibv_sge rsge2 = buf.sge(1024 + i * 256, 256);
    ASSERT_EQ(post_recv(qps[i], 200 + i, &rsge2, 1), 0);
  }
  // qps[0] -> qps[1], qps[0] -> qps[2], qps[2] -> qps[1].
  const std::pair<int, int> flows[3] = {{0, 1}, {0, 2}, {2, 1}};
  for (auto [from, to] : flows) {
    ibv_sge sge = buf.sge(3072, 8);
    ibv_send_wr wr = make_wr(from * 10 + to, IBV_WR_SEND, &sge, 1);
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qps[to]->qp_num;
    wr.wr.ud.remote_qkey = cfg.qkey;
    ASSERT_EQ(post_send(qps[from], wr), 0);
  }
  auto wcs = poll_n(cq, 6);
  ASSERT_EQ(wcs.size(), 6u);
  int receives = 0;
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    if (wc.opcode != IBV_WC_RECV) continue;
    ++receives;
    if (wc.qp_num == qps[2]->qp_num) {
      EXPECT_EQ(wc.src_qp, qps[0]->qp_num);
    }
    if (wc.qp_num == qps[1]->qp_num) {
      EXPECT_TRUE(wc.src_qp == qps[0]->qp_num || wc.src_qp == qps[2]->qp_num);
    }
  }
  EXPECT_EQ(receives, 3);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (auto* qp : qps) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

}  // namespace
}  // namespace loopback
