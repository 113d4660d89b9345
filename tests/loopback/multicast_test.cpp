// UD multicast between QPs of one process: ibv_attach_mcast puts a QP in a
// group, a send to (group GID, QPN 0xFFFFFF) reaches every attached QP with
// the GRH naming the group and src_qp naming the sender, ibv_detach_mcast
// stops delivery, and only UD QPs may attach.
//
// Attaching joins the group's IP address on every interface that reaches
// other hosts (multicast between hosts), which would announce the group on
// whatever network this machine is on. So these tests run in a network
// namespace of their own holding only lo, entered before main; where none
// can be made (no root), they are skipped.
#include <arpa/inet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/limits.hpp"
#include "loopback.hpp"

namespace loopback {
namespace {

// Enters a network namespace of lo alone, up; false when none can be made.
bool enter_private_network() {
  if (::unshare(CLONE_NEWNET) != 0) return false;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  const bool up = ::ioctl(fd, SIOCGIFFLAGS, &request) == 0 &&
                  (request.ifr_flags |= IFF_UP, ::ioctl(fd, SIOCSIFFLAGS, &request) == 0);
  ::close(fd);
  return up;
}

// Static initialisation: before gtest_main starts anything (or any thread).
const bool kPrivateNetwork = enter_private_network();

class PrivateNetwork final : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!kPrivateNetwork)
      GTEST_SKIP() << "needs a network namespace of its own (root): attaching would join groups on this "
                      "machine's network";
  }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment = ::testing::AddGlobalTestEnvironment(new PrivateNetwork);

constexpr uint32_t kGrh = softhca::limits::kUdGrhBytes;
constexpr uint32_t kQkey = 0x01234567;  // RDMA_UDP_QKEY, what rdma_cm joins use
constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// 239.1.1.1 as RoCE writes an IPv4 group: ::ffff:239.1.1.1.
ibv_gid ipv4_group(uint8_t last = 1) {
  ibv_gid gid{};
  gid.raw[10] = gid.raw[11] = 0xff;
  gid.raw[12] = 239;
  gid.raw[13] = 1;
  gid.raw[14] = 1;
  gid.raw[15] = last;
  return gid;
}

QpConfig ud_config() {
  QpConfig cfg;
  cfg.type = IBV_QPT_UD;
  cfg.qkey = kQkey;
  return cfg;
}

// One UD QP with its own CQ, brought to RTS.
struct UdQp {
  explicit UdQp(Device& dev, const QpConfig& cfg = ud_config()) {
    cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
    if (cq == nullptr) return;
    qp = create_qp(dev.pd, cq, cq, cfg);
    if (qp != nullptr && bring_up(qp, 0, dev.gid, cfg) != 0) {
      ibv_destroy_qp(qp);
      qp = nullptr;
    }
  }
  ~UdQp() {
    if (qp) ibv_destroy_qp(qp);
    if (cq) ibv_destroy_cq(cq);
  }
  UdQp(const UdQp&) = delete;
  UdQp& operator=(const UdQp&) = delete;
  bool ok() const { return qp != nullptr; }
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
};

ibv_ah* group_ah(Device& dev, const ibv_gid& group) {
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.grh.dgid = group;
  attr.grh.sgid_index = 0;
  attr.grh.hop_limit = 64;
  attr.port_num = 1;
  return ibv_create_ah(dev.pd, &attr);
}

int send_to_group(UdQp& from, ibv_ah* ah, Buffer& src, uint32_t len, uint64_t wr_id) {
  ibv_sge sge = src.sge(0, len);
  ibv_send_wr wr = make_wr(wr_id, IBV_WR_SEND, &sge, 1);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = kMulticastQpn;
  wr.wr.ud.remote_qkey = kQkey;
  return post_send(from.qp, wr);
}

TEST(Multicast, EveryAttachedQpReceivesOneSend) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  UdQp sender(dev), r1(dev), r2(dev), outsider(dev);
  ASSERT_TRUE(sender.ok() && r1.ok() && r2.ok() && outsider.ok());
  const ibv_gid group = ipv4_group();
  ASSERT_EQ(ibv_attach_mcast(r1.qp, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(r2.qp, &group, 0), 0);
  ibv_ah* ah = group_ah(dev, group);
  ASSERT_NE(ah, nullptr);

  constexpr uint32_t n = 100;
  Buffer src(dev.pd, n);
  fill_pattern(src.span(0, n), 7);
  Buffer d1(dev.pd, kGrh + n), d2(dev.pd, kGrh + n), d3(dev.pd, kGrh + n);
  ibv_sge s1 = d1.sge(0, kGrh + n), s2 = d2.sge(0, kGrh + n), s3 = d3.sge(0, kGrh + n);
  ASSERT_EQ(post_recv(r1.qp, 1, &s1, 1), 0);
  ASSERT_EQ(post_recv(r2.qp, 2, &s2, 1), 0);
  ASSERT_EQ(post_recv(outsider.qp, 3, &s3, 1), 0);
  ASSERT_EQ(send_to_group(sender, ah, src, n, 9), 0);

  ibv_wc wc{};
  ASSERT_TRUE(poll_one(sender.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 9u);
  struct Expect {
    UdQp* qp;
    Buffer* buf;
    uint64_t wr_id;
  };
  for (const Expect& e : {Expect{&r1, &d1, 1}, Expect{&r2, &d2, 2}}) {
    ASSERT_TRUE(poll_one(e.qp->cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, e.wr_id);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, kGrh + n);
    EXPECT_EQ(wc.qp_num, e.qp->qp->qp_num);
    EXPECT_EQ(wc.src_qp, sender.qp->qp_num);
    EXPECT_NE(wc.wc_flags & IBV_WC_GRH, 0u);
    EXPECT_EQ(first_mismatch(e.buf->span(kGrh, n), src.span(0, n)), -1);
    // An IPv4 group: the GRH's last 20 bytes are an IPv4 header to 239.1.1.1.
    const uint8_t* grh = e.buf->data();
    EXPECT_EQ(grh[20], 0x45);
    EXPECT_EQ(std::memcmp(grh + 32, dev.gid.raw + 12, 4), 0);  // from our address
    EXPECT_EQ(std::memcmp(grh + 36, group.raw + 12, 4), 0);    // to the group
  }
  EXPECT_TRUE(stays_empty(outsider.cq, Millis{20})) << "a QP not in the group receives nothing";
  EXPECT_TRUE(stays_empty(sender.cq, Millis{1}));
  ibv_destroy_ah(ah);
}

TEST(Multicast, Ipv6GroupCarriesTheGroupInTheGrh) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  UdQp sender(dev), r(dev);
  ASSERT_TRUE(sender.ok() && r.ok());
  ibv_gid group{};
  group.raw[0] = 0xff;
  group.raw[1] = 0x0e;
  group.raw[15] = 0x42;
  ASSERT_EQ(ibv_attach_mcast(r.qp, &group, 0), 0);
  ibv_ah* ah = group_ah(dev, group);
  ASSERT_NE(ah, nullptr);
  Buffer src(dev.pd, 16);
  Buffer dst(dev.pd, kGrh + 16);
  ibv_sge rs = dst.sge(0, kGrh + 16);
  ASSERT_EQ(post_recv(r.qp, 1, &rs, 1), 0);
  ASSERT_EQ(send_to_group(sender, ah, src, 16, 2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(r.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.src_qp, sender.qp->qp_num);
  EXPECT_EQ(std::memcmp(dst.data() + 24, group.raw, 16), 0);  // the IPv6 header's destination
  ibv_destroy_ah(ah);
}

TEST(Multicast, SenderAttachedToItsGroupGetsItsOwnCopy) {
  // Multicast loopback, as rxe and mlx5 do and mckey expects by default.
  Device dev;
  ASSERT_TRUE(dev.ok());
  UdQp sender(dev);
  ASSERT_TRUE(sender.ok());
  const ibv_gid group = ipv4_group(3);
  ASSERT_EQ(ibv_attach_mcast(sender.qp, &group, 0), 0);
  ibv_ah* ah = group_ah(dev, group);
  ASSERT_NE(ah, nullptr);
  Buffer src(dev.pd, 8);
  Buffer dst(dev.pd, kGrh + 8);
  ibv_sge rs = dst.sge(0, kGrh + 8);
  ASSERT_EQ(post_recv(sender.qp, 1, &rs, 1), 0);
  ASSERT_EQ(send_to_group(sender, ah, src, 8, 2), 0);
  bool got_send = false, got_recv = false;
  for (int i = 0; i < 2; ++i) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(sender.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    if (wc.opcode == IBV_WC_SEND) got_send = true;
    if (wc.opcode == IBV_WC_RECV) {
      got_recv = true;
      EXPECT_EQ(wc.src_qp, sender.qp->qp_num);
    }
  }
  EXPECT_TRUE(got_send && got_recv);
  ibv_destroy_ah(ah);
}

TEST(Multicast, BlockSelfLoopbackKeepsTheSendersCopyOnly) {
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (mckey -l): the sender's own QP gets
  // nothing back; the other members still do.
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr_ex attr{};
  attr.send_cq = attr.recv_cq = cq;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_UD;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  attr.pd = dev.pd;
  attr.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  ibv_qp* qp = ibv_create_qp_ex(dev.ctx, &attr);
  ASSERT_NE(qp, nullptr) << errno;
  ASSERT_EQ(bring_up(qp, 0, dev.gid, ud_config()), 0);
  UdQp other(dev);
  ASSERT_TRUE(other.ok());
  const ibv_gid group = ipv4_group(5);
  ASSERT_EQ(ibv_attach_mcast(qp, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(other.qp, &group, 0), 0);
  ibv_ah* ah = group_ah(dev, group);
  ASSERT_NE(ah, nullptr);
  Buffer src(dev.pd, 8);
  Buffer d1(dev.pd, kGrh + 8), d2(dev.pd, kGrh + 8);
  ibv_sge s1 = d1.sge(0, kGrh + 8), s2 = d2.sge(0, kGrh + 8);
  ASSERT_EQ(post_recv(qp, 1, &s1, 1), 0);
  ASSERT_EQ(post_recv(other.qp, 2, &s2, 1), 0);
  ibv_sge sge = src.sge(0, 8);
  ibv_send_wr wr = make_wr(3, IBV_WR_SEND, &sge, 1);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = kMulticastQpn;
  wr.wr.ud.remote_qkey = kQkey;
  ASSERT_EQ(post_send(qp, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(other.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.src_qp, qp->qp_num);
  ASSERT_TRUE(poll_one(cq, &wc));
  EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  EXPECT_TRUE(stays_empty(cq, Millis{20})) << "no copy back to the sending QP";
  ibv_destroy_ah(ah);
  ibv_destroy_qp(qp);

  attr.qp_type = IBV_QPT_RC;  // only UD QPs take the flag
  EXPECT_EQ(ibv_create_qp_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_destroy_cq(cq);
}

TEST(Multicast, DetachStopsDelivery) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  UdQp sender(dev), r1(dev), r2(dev);
  ASSERT_TRUE(sender.ok() && r1.ok() && r2.ok());
  const ibv_gid group = ipv4_group(2);
  ASSERT_EQ(ibv_attach_mcast(r1.qp, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(r2.qp, &group, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(r2.qp, &group, 0), 0) << "attaching twice is a no-op, as in uverbs";
  ASSERT_EQ(ibv_detach_mcast(r1.qp, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(r1.qp, &group, 0), EINVAL) << "not attached any more";
  ibv_ah* ah = group_ah(dev, group);
  ASSERT_NE(ah, nullptr);
  Buffer src(dev.pd, 8);
  Buffer d1(dev.pd, kGrh + 8), d2(dev.pd, kGrh + 8);
  ibv_sge s1 = d1.sge(0, kGrh + 8), s2 = d2.sge(0, kGrh + 8);
  ASSERT_EQ(post_recv(r1.qp, 1, &s1, 1), 0);
  ASSERT_EQ(post_recv(r2.qp, 2, &s2, 1), 0);
  ASSERT_EQ(send_to_group(sender, ah, src, 8, 3), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(r2.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.byte_len, kGrh + 8) << "exactly one copy for a QP attached twice";
  EXPECT_TRUE(stays_empty(r1.cq, Millis{20}));
  EXPECT_TRUE(stays_empty(r2.cq, Millis{1}));

  // The last member leaving frees the group: a send now reaches nobody.
  ASSERT_EQ(ibv_detach_mcast(r2.qp, &group, 0), 0);
  ASSERT_EQ(post_recv(r2.qp, 4, &s2, 1), 0);
  ASSERT_EQ(send_to_group(sender, ah, src, 8, 5), 0);
  ASSERT_TRUE(poll_one(sender.cq, &wc));  // the first send
  ASSERT_TRUE(poll_one(sender.cq, &wc));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "a UD sender never learns of a drop";
  EXPECT_TRUE(stays_empty(r2.cq, Millis{20}));
  ibv_destroy_ah(ah);
}

TEST(Multicast, DestroyedQpLeavesItsGroups) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const ibv_gid group = ipv4_group(4);
  {
    UdQp gone(dev);
    ASSERT_TRUE(gone.ok());
    ASSERT_EQ(ibv_attach_mcast(gone.qp, &group, 0), 0);
  }
  // The group's only member was destroyed: attaching anew finds a clean group,
  // and detaching a QP that never attached is refused.
  UdQp r(dev);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ibv_detach_mcast(r.qp, &group, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(r.qp, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(r.qp, &group, 0), 0);
}

TEST(Multicast, OnlyUdQpsAndMulticastGidsAttach) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* rc = create_qp(dev.pd, cq, cq, QpConfig{});
  ASSERT_NE(rc, nullptr);
  const ibv_gid group = ipv4_group();
  EXPECT_EQ(ibv_attach_mcast(rc, &group, 0), EINVAL);
  EXPECT_EQ(ibv_detach_mcast(rc, &group, 0), EINVAL);
  ibv_destroy_qp(rc);

  UdQp ud(dev);
  ASSERT_TRUE(ud.ok());
  EXPECT_EQ(ibv_attach_mcast(ud.qp, &dev.gid, 0), EINVAL) << "a unicast GID is no group";
  ibv_destroy_cq(cq);
}

TEST(Multicast, DeviceReportsTheGroupLimits) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  EXPECT_GT(attr.max_mcast_grp, 0);
  EXPECT_GT(attr.max_mcast_qp_attach, 1);
  EXPECT_GE(attr.max_total_mcast_qp_attach, attr.max_mcast_grp * attr.max_mcast_qp_attach);
}

}  // namespace
}  // namespace loopback
