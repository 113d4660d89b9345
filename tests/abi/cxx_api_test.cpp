// The C++ API in include/softhca as an application uses it: enumerate and
// open, register memory, connect two RC QPs in one process with the typed
// state helpers, move bytes with SEND and RDMA WRITE, and get errno-carrying
// errors (and VerbsError from the throwing forms) where the verbs refuse.
#include <gtest/gtest.h>

#include <softhca/softhca.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using namespace softhca;

constexpr Access kRemoteAll = Access::LocalWrite | Access::RemoteWrite | Access::RemoteRead;

// Polls until one completion arrives or a second passes.
std::optional<ibv_wc> wait_one(const CompletionQueue& cq) {
  std::array<ibv_wc, 1> wc{};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = cq.poll(wc);
    if (!got) return std::nullopt;
    if (!got->empty()) return got->front();
  }
  return std::nullopt;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 7 + seed) & 0xff);
  return v;
}

struct Side {
  explicit Side(const Context& ctx, const ProtectionDomain& pd)
      : cq(CompletionQueue::make(ctx, 64)),
        qp(QueuePair::make(pd, cq, cq, QpConfig{.type = QpType::RC, .cap = {16, 16, 2, 2, 0}})),
        buf(4096),
        mr(MemoryRegion::make(pd, buf, kRemoteAll)) {}
  CompletionQueue cq;
  QueuePair qp;
  std::vector<std::byte> buf;
  MemoryRegion mr;
};

class CxxApi : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Context::create();
    ASSERT_TRUE(c) << c.error().message();
    ctx = std::move(*c);
    auto p = ProtectionDomain::create(ctx);
    ASSERT_TRUE(p) << p.error().message();
    pd = std::move(*p);
  }
  Context ctx;
  ProtectionDomain pd;
};

TEST(CxxDevices, ListAndOpenByName) {
  auto list = DeviceList::create();
  ASSERT_TRUE(list) << list.error().message();
  ASSERT_FALSE(list->empty());
  const char* name = ibv_get_device_name((*list)[0]);
  EXPECT_EQ(list->find(name), (*list)[0]);
  EXPECT_EQ(list->find("no-such-device"), nullptr);

  auto ctx = Context::create(name);
  ASSERT_TRUE(ctx);
  EXPECT_EQ(ctx->name(), name);

  auto missing = Context::create("no-such-device");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENODEV);
  EXPECT_THROW(Context::make("no-such-device"), VerbsError);

  // Moving transfers ownership; reset() on the moved-from one is a no-op.
  Context moved = std::move(*ctx);
  EXPECT_FALSE(*ctx);
  EXPECT_TRUE(ctx->reset());
  EXPECT_TRUE(moved.reset());
  EXPECT_FALSE(moved);
}

TEST_F(CxxApi, Queries) {
  auto dev = ctx.query_device();
  ASSERT_TRUE(dev) << dev.error().message();
  EXPECT_GE(dev->phys_port_cnt, 1);
  auto port = ctx.query_port(1);
  ASSERT_TRUE(port) << port.error().message();
  EXPECT_EQ(port->state, IBV_PORT_ACTIVE);
  // ::ffff:127.0.0.1, the loopback RoCE v2 GID, is in the table (after
  // the interfaces' addresses).
  const std::array<std::uint8_t, 16> v4mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  bool found = false;
  for (int index = 0; index < port->gid_tbl_len && !found; ++index) {
    auto gid = ctx.query_gid(1, index);
    ASSERT_TRUE(gid);
    found = std::memcmp(gid->raw, v4mapped.data(), 16) == 0;
  }
  EXPECT_TRUE(found);

  auto bad_port = ctx.query_port(99);
  ASSERT_FALSE(bad_port);
  EXPECT_STREQ(bad_port.error().verb(), "ibv_query_port");
}

TEST_F(CxxApi, RcSendAndWrite) {
  Side a(ctx, pd), b(ctx, pd);
  ibv_gid gid = value_or_throw(ctx.query_gid(1, 0));

  // Step by step on one side, connect() on the other.
  ASSERT_TRUE(a.qp.to_init(kRemoteAll));
  EXPECT_EQ(*a.qp.state(), IBV_QPS_INIT);
  ASSERT_TRUE(a.qp.to_rtr(RemoteQp{.qpn = b.qp.qpn(), .psn = 200, .gid = gid}));
  ASSERT_TRUE(a.qp.to_rts(100));
  EXPECT_EQ(*a.qp.state(), IBV_QPS_RTS);
  auto r = b.qp.connect(RemoteQp{.qpn = a.qp.qpn(), .psn = 100, .gid = gid}, 200, kRemoteAll);
  ASSERT_TRUE(r) << r.error().message();

  // SEND: a -> b, two gather entries into one scatter entry.
  auto msg = pattern(300, 1);
  std::copy(msg.begin(), msg.end(), a.buf.begin());
  ASSERT_TRUE(b.qp.recv(std::array{b.mr.sge()}, 7));
  std::array sges{a.mr.sge(0, 100), a.mr.sge(100, 200)};
  ASSERT_TRUE(a.qp.send(sges, 8));

  auto sc = wait_one(a.cq);
  ASSERT_TRUE(sc);
  EXPECT_EQ(sc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(sc->wr_id, 8u);
  EXPECT_EQ(sc->opcode, IBV_WC_SEND);
  auto rc = wait_one(b.cq);
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(rc->wr_id, 7u);
  EXPECT_EQ(rc->opcode, IBV_WC_RECV);
  EXPECT_EQ(rc->byte_len, 300u);
  EXPECT_TRUE(std::equal(msg.begin(), msg.end(), b.buf.begin()));

  // RDMA WRITE: b -> a at offset 1024, larger than one MTU.
  auto data = pattern(2500, 9);
  std::copy(data.begin(), data.end(), b.buf.begin());
  ASSERT_TRUE(b.qp.write(std::array{b.mr.sge(0, data.size())}, a.mr.addr() + 1024, a.mr.rkey(), 9));
  auto wc = wait_one(b.cq);
  ASSERT_TRUE(wc);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), a.buf.begin() + 1024));

  // RDMA READ back: a reads b's first 64 bytes into its tail.
  ASSERT_TRUE(a.qp.read(std::array{a.mr.sge(4096 - 64, 64)}, b.mr.addr(), b.mr.rkey(), 10));
  auto rd = wait_one(a.cq);
  ASSERT_TRUE(rd);
  EXPECT_EQ(rd->status, IBV_WC_SUCCESS);
  EXPECT_EQ(rd->opcode, IBV_WC_RDMA_READ);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 64, a.buf.end() - 64));

  // Nothing left: poll returns an empty subspan.
  std::array<ibv_wc, 4> more{};
  auto none = a.cq.poll(more);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

TEST_F(CxxApi, UdSend) {
  auto cq = CompletionQueue::make(ctx, 16);
  auto sq = QueuePair::make(pd, cq, cq, QpConfig{.type = QpType::UD});
  auto rq = QueuePair::make(pd, cq, cq, QpConfig{.type = QpType::UD});
  constexpr std::uint32_t kQkey = 0x1234;
  for (auto* qp : {&sq, &rq}) {
    ASSERT_TRUE(qp->to_init_ud(kQkey));
    ASSERT_TRUE(qp->to_rtr());
    ASSERT_TRUE(qp->to_rts(0));
  }
  std::vector<std::byte> buf(1024);
  auto mr = MemoryRegion::make(pd, buf, Access::LocalWrite);
  auto ah = AddressHandle::make(pd, value_or_throw(ctx.query_gid(1, 0)));
  auto msg = pattern(100, 3);
  std::copy(msg.begin(), msg.end(), buf.begin());
  // The receive buffer starts with the 40-byte GRH.
  ASSERT_TRUE(rq.recv(std::array{mr.sge(512, 40 + 100)}, 1));
  ASSERT_TRUE(sq.send(std::array{mr.sge(0, 100)}, 2, ah, rq.qpn(), kQkey));
  int got = 0;
  for (int i = 0; i < 2; ++i) {
    auto wc = wait_one(cq);
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    if (wc->opcode == IBV_WC_RECV) {
      EXPECT_EQ(wc->byte_len, 140u);
      EXPECT_EQ(wc->src_qp, sq.qpn());
      ++got;
    }
  }
  EXPECT_EQ(got, 1);
  EXPECT_TRUE(std::equal(msg.begin(), msg.end(), buf.begin() + 512 + 40));
}

TEST_F(CxxApi, ErrorsCarryErrnoAndVerb) {
  auto cq = CompletionQueue::make(ctx, 16);

  QpConfig too_many{.type = QpType::RC, .cap = {16, 16, 1000, 1, 0}};
  auto qp = QueuePair::create(pd, cq, cq, too_many);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error().code(), EINVAL);
  EXPECT_STREQ(qp.error().verb(), "ibv_create_qp");
  try {
    (void)QueuePair::make(pd, cq, cq, too_many);
    ADD_FAILURE() << "no exception";
  } catch (const VerbsError& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
    EXPECT_EQ(e.code().category(), std::generic_category());
    EXPECT_STREQ(e.error().verb(), "ibv_create_qp");
  }

  // Remote write needs local write (IB spec 10.6.3.1, and ibv_reg_mr(3)).
  std::vector<std::byte> buf(256);
  auto mr = MemoryRegion::create(pd, buf, Access::RemoteWrite);
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error().code(), EINVAL);
  EXPECT_STREQ(mr.error().verb(), "ibv_reg_mr");
  EXPECT_THROW((void)MemoryRegion::make(pd, buf, Access::RemoteWrite), VerbsError);

  // A bad transition: RESET -> RTR skips INIT.
  auto ok = QueuePair::make(pd, cq, cq);
  auto rtr = ok.to_rtr(RemoteQp{.qpn = ok.qpn()});
  ASSERT_FALSE(rtr);
  EXPECT_EQ(rtr.error().code(), EINVAL);
  EXPECT_STREQ(rtr.error().verb(), "ibv_modify_qp");
  EXPECT_THROW(value_or_throw(ok.to_rtr(RemoteQp{.qpn = ok.qpn()})), VerbsError);

  // Deallocating a PD that still has a QP fails and leaves the PD owned.
  auto pd2 = ProtectionDomain::make(ctx);
  {
    auto held = QueuePair::make(pd2, cq, cq);
    auto busy = pd2.reset();
    ASSERT_FALSE(busy);
    EXPECT_EQ(busy.error().code(), EBUSY);
    EXPECT_TRUE(pd2);
  }
  EXPECT_TRUE(pd2.reset());
  EXPECT_FALSE(pd2);
}

TEST_F(CxxApi, CompletionChannelEvent) {
  auto ch = CompletionChannel::make(ctx);
  int tag = 0;
  auto cq = CompletionQueue::make(ctx, 16, &ch, &tag);
  auto qp = QueuePair::make(pd, cq, cq, QpConfig{.type = QpType::UD});
  ASSERT_TRUE(qp.to_init_ud(1));
  ASSERT_TRUE(qp.to_rtr());
  ASSERT_TRUE(qp.to_rts(0));
  ASSERT_TRUE(cq.req_notify());
  std::vector<std::byte> buf(64);
  auto mr = MemoryRegion::make(pd, buf, Access::LocalWrite);
  auto ah = AddressHandle::make(pd, value_or_throw(ctx.query_gid(1, 0)));
  ASSERT_TRUE(qp.send(std::array{mr.sge(0, 8)}, 1, ah, qp.qpn(), 1));
  auto ev = ch.get_event();
  ASSERT_TRUE(ev) << ev.error().message();
  EXPECT_EQ(*ev, cq.get());
  EXPECT_EQ((*ev)->cq_context, &tag);
  cq.ack_events(1);
}

// Two RC QPs drawing their receives from one SRQ (QpConfig::srq): each
// SEND takes the next posted buffer whichever QP it arrives on, and the
// completion names the QP.
TEST_F(CxxApi, SharedReceiveQueue) {
  auto srq = SharedReceiveQueue::create(pd, 8);
  ASSERT_TRUE(srq) << srq.error().message();
  auto attr = srq->query();
  ASSERT_TRUE(attr) << attr.error().message();
  EXPECT_GE(attr->max_wr, 8u);
  EXPECT_EQ(attr->srq_limit, 0u);

  auto cq = CompletionQueue::make(ctx, 32);
  const QpConfig with_srq{.type = QpType::RC, .cap = {4, 0, 1, 0, 0}, .srq = &*srq};
  auto r1 = QueuePair::make(pd, cq, cq, with_srq);
  auto r2 = QueuePair::make(pd, cq, cq, with_srq);
  Side s1(ctx, pd), s2(ctx, pd);
  const ibv_gid gid = value_or_throw(ctx.query_gid(1, 0));
  ASSERT_TRUE(r1.connect({.qpn = s1.qp.qpn(), .gid = gid}, 0, Access::LocalWrite));
  ASSERT_TRUE(s1.qp.connect({.qpn = r1.qpn(), .gid = gid}, 0, Access::None));
  ASSERT_TRUE(r2.connect({.qpn = s2.qp.qpn(), .gid = gid}, 0, Access::LocalWrite));
  ASSERT_TRUE(s2.qp.connect({.qpn = r2.qpn(), .gid = gid}, 0, Access::None));

  std::vector<std::byte> rbuf(2 * 64);
  auto rmr = MemoryRegion::make(pd, rbuf, Access::LocalWrite);
  ASSERT_TRUE(srq->recv(std::array{rmr.sge(0, 64)}, 100));
  ASSERT_TRUE(srq->recv(std::array{rmr.sge(64, 64)}, 101));
  // The limit event is armed below the two posted: accepted, not yet fired.
  ASSERT_TRUE(srq->arm_limit(1));
  EXPECT_EQ(value_or_throw(srq->query()).srq_limit, 1u);

  std::memcpy(s1.buf.data(), "one", 4);
  std::memcpy(s2.buf.data(), "two", 4);
  ASSERT_TRUE(s1.qp.send(std::array{s1.mr.sge(0, 4)}, 1));
  ASSERT_TRUE(wait_one(s1.cq));
  ASSERT_TRUE(s2.qp.send(std::array{s2.mr.sge(0, 4)}, 2));
  ASSERT_TRUE(wait_one(s2.cq));

  auto first = wait_one(cq);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, IBV_WC_SUCCESS);
  EXPECT_EQ(first->wr_id, 100u);
  EXPECT_EQ(first->qp_num, r1.qpn());
  EXPECT_STREQ(reinterpret_cast<const char*>(rbuf.data()), "one");
  auto second = wait_one(cq);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->wr_id, 101u);
  EXPECT_EQ(second->qp_num, r2.qpn());
  EXPECT_STREQ(reinterpret_cast<const char*>(rbuf.data() + 64), "two");

  // Errors name the verb.
  auto too_many = SharedReceiveQueue::create(pd, 1u << 30);
  ASSERT_FALSE(too_many);
  EXPECT_STREQ(too_many.error().verb(), "ibv_create_srq");
}

TEST(CxxFlags, Bitwise) {
  constexpr Access a = Access::LocalWrite | Access::RemoteRead;
  static_assert(to_ibv(a) == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  static_assert(any(a, Access::RemoteRead));
  static_assert(!any(a, Access::RemoteWrite));
  static_assert(to_ibv(a & ~Access::LocalWrite) == IBV_ACCESS_REMOTE_READ);
  Access b = Access::None;
  b |= Access::RemoteAtomic;
  EXPECT_EQ(b, Access::RemoteAtomic);
}

}  // namespace
