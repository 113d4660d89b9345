// The C++ rdma_cm API (include/softhca/cm.hpp) as an application uses it:
// listen, resolve, connect and accept with private data both ways, a SEND
// over the QPs the CM moved to RTS, disconnect on both sides, and the errors
// a refused connection and bad input give.
#include <gtest/gtest.h>

#include <softhca/cm.hpp>
#include <softhca/softhca.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>

namespace {

using namespace softhca;
using std::chrono::milliseconds;

constexpr milliseconds kWait{5000};

std::span<const std::byte> bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

std::string_view text(std::span<const std::byte> b, std::size_t n) {
  return {reinterpret_cast<const char*>(b.data()), std::min(n, b.size())};
}

TEST(CxxCm, ConnectSendDisconnect) {
  auto ch = EventChannel::make();
  // Verbs objects before the ids whose QPs use them: destroyed after them.
  std::optional<ProtectionDomain> pd;
  std::optional<CompletionQueue> cq;
  std::array<std::byte, 64> send_buf{}, recv_buf{};
  std::optional<MemoryRegion> send_mr, recv_mr;

  auto listener = CmId::make(ch);
  ASSERT_TRUE(listener.bind(SocketAddress::make("127.0.0.1", 0)));
  ASSERT_TRUE(listener.listen(4));
  const std::uint16_t port = listener.src_port();
  ASSERT_NE(port, 0);

  auto client = CmId::make(ch);
  ASSERT_TRUE(client.resolve_addr(SocketAddress::make("127.0.0.1", port)));
  ASSERT_TRUE(ch.expect(RDMA_CM_EVENT_ADDR_RESOLVED, kWait));
  ASSERT_NE(client.verbs(), nullptr);
  ASSERT_TRUE(client.resolve_route());
  ASSERT_TRUE(ch.expect(RDMA_CM_EVENT_ROUTE_RESOLVED, kWait));

  pd.emplace(ProtectionDomain::make(client.verbs()));
  cq.emplace(CompletionQueue::make(client.verbs(), 16));
  send_mr.emplace(MemoryRegion::make(*pd, send_buf, Access::LocalWrite));
  recv_mr.emplace(MemoryRegion::make(*pd, recv_buf, Access::LocalWrite));
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq->get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  ASSERT_TRUE(client.create_qp(attr, pd->get()));
  ASSERT_NE(client.qp(), nullptr);

  ASSERT_TRUE(client.connect({.private_data = bytes("hello")}));
  auto req = ch.expect(RDMA_CM_EVENT_CONNECT_REQUEST, kWait);
  ASSERT_TRUE(req) << req.error().message();
  EXPECT_EQ(req->listen_id(), listener.get());
  EXPECT_EQ(text(req->private_data(), 5), "hello");
  CmId server(req->id());
  ASSERT_TRUE(req->reset());

  ASSERT_TRUE(server.create_qp(attr, pd->get()));
  ibv_sge rsge = recv_mr->sge();
  ibv_recv_wr rwr{.wr_id = 7, .next = nullptr, .sg_list = &rsge, .num_sge = 1};
  ASSERT_TRUE(server.post_recv(rwr));
  ASSERT_TRUE(server.accept({.private_data = bytes("welcome")}));

  // The requester's ESTABLISHED (librdmacm moved its QP to RTS and sent the
  // RTU) carries the accept's private data; the acceptor's follows the RTU.
  auto est = ch.expect(RDMA_CM_EVENT_ESTABLISHED, kWait);
  ASSERT_TRUE(est) << est.error().message();
  EXPECT_EQ(est->id(), client.get());
  EXPECT_EQ(text(est->private_data(), 7), "welcome");
  est->reset();
  est = ch.expect(RDMA_CM_EVENT_ESTABLISHED, kWait);
  ASSERT_TRUE(est) << est.error().message();
  EXPECT_EQ(est->id(), server.get());
  est->reset();

  std::memcpy(send_buf.data(), "ping", 5);
  ibv_sge ssge = send_mr->sge(0, 5);
  ibv_send_wr swr{};
  swr.wr_id = 9;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_TRUE(client.post_send(swr));
  int seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  std::array<ibv_wc, 2> wc{};
  while (seen < 2 && std::chrono::steady_clock::now() < deadline) {
    auto got = cq->poll(std::span(wc).subspan(0, 2 - seen));
    ASSERT_TRUE(got);
    for (const ibv_wc& w : *got) {
      EXPECT_EQ(w.status, IBV_WC_SUCCESS) << ibv_wc_status_str(w.status);
      EXPECT_TRUE(w.wr_id == 7 || w.wr_id == 9);
    }
    seen += static_cast<int>(got->size());
  }
  ASSERT_EQ(seen, 2);
  EXPECT_EQ(text(recv_buf, 4), "ping");

  ASSERT_TRUE(client.disconnect());
  for (int i = 0; i < 2; ++i) {
    auto ev = ch.expect(RDMA_CM_EVENT_DISCONNECTED, kWait);
    ASSERT_TRUE(ev) << ev.error().message();
  }
}

TEST(CxxCm, ErrorsCarryTheCallAndErrno) {
  auto ch = EventChannel::make();
  auto listener = CmId::make(ch);
  ASSERT_TRUE(listener.bind(SocketAddress::make("127.0.0.1", 0)));
  const std::uint16_t port = listener.src_port();  // bound, not listening

  auto client = CmId::make(ch);
  ASSERT_TRUE(client.resolve_addr(SocketAddress::make("127.0.0.1", port)));
  ASSERT_TRUE(ch.expect(RDMA_CM_EVENT_ADDR_RESOLVED, kWait));
  ASSERT_TRUE(client.resolve_route());
  ASSERT_TRUE(ch.expect(RDMA_CM_EVENT_ROUTE_RESOLVED, kWait));
  // No QP on the id: the application names one.
  rdma_conn_param raw{};
  raw.qp_num = 0x42;
  ASSERT_EQ(rdma_connect(client.get(), &raw), 0);
  auto refused = ch.expect(RDMA_CM_EVENT_CONNECT_RESPONSE, kWait);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ECONNREFUSED);

  // A second bind of the same id, a port in use, a name that is no number.
  auto again = listener.bind(SocketAddress::make("127.0.0.1", 0));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EINVAL);
  EXPECT_STREQ(again.error().verb(), "rdma_bind_addr");
  auto other = CmId::make(ch);
  auto in_use = other.bind(SocketAddress::make("127.0.0.1", port));
  ASSERT_FALSE(in_use);
  EXPECT_EQ(in_use.error().code(), EADDRINUSE);
  EXPECT_FALSE(SocketAddress::create("localhost.invalid", 1));
  EXPECT_THROW(SocketAddress::make("not an address", 1), VerbsError);

  // Nothing more is queued.
  auto none = ch.get_event(milliseconds(50));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ETIMEDOUT);
}

}  // namespace
