// rdma_cm when the other side's CM does not answer, through the public API:
// a peer process that is stopped (SIGSTOP: alive, connected, silent) during
// the handshake or while connected, a peer that takes longer than the REQ
// timeout to accept (the MRA keeps the requester waiting), an active side
// that never sends its RTU, and an event channel destroyed with ids still on
// it. The CM timeouts are shortened through SOFTHCA_CM_RESPONSE_TIMEOUT and
// SOFTHCA_CM_MAX_RETRIES, which each request reads when it is sent:
// response time 2^16 * 4.096 us = 256 ms and 3 retries give a REQ or DREQ
// 4 tries of 2 * 256 + 256 ms (about 3.1 s), and the passive side 4 waits of
// 256 ms for its RTU.
#include <gtest/gtest.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "cm_test_support.hpp"

namespace {

using namespace cm_test;

constexpr int kGiveUpMs = 4 * (2 * 256 + 256);  // when the requester gives up
constexpr int kEventLimitMs = kGiveUpMs + 5000;

class CmTimeout : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(setenv("SOFTHCA_CM_RESPONSE_TIMEOUT", "16", 1), 0);
    ASSERT_EQ(setenv("SOFTHCA_CM_MAX_RETRIES", "3", 1), 0);
    ch_ = rdma_create_event_channel();
    ASSERT_NE(ch_, nullptr);
  }
  void TearDown() override {
    if (ch_ != nullptr) rdma_destroy_event_channel(ch_);
    unsetenv("SOFTHCA_CM_RESPONSE_TIMEOUT");
    unsetenv("SOFTHCA_CM_MAX_RETRIES");
  }

  rdma_cm_id* connect_to(uint16_t port) {
    rdma_cm_id* id = resolved_id(ch_, port);
    rdma_conn_param param{};
    param.qp_num = 0x99;
    EXPECT_EQ(rdma_connect(id, &param), 0);
    return id;
  }

  rdma_event_channel* ch_ = nullptr;
};

long elapsed_ms(std::chrono::steady_clock::time_point since) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count());
}

TEST_F(CmTimeout, RequestToAStoppedPeerIsUnreachableAfterTheRetries) {
  const uint16_t port = test_port(0);
  Peer peer;
  ASSERT_TRUE(peer.start("hold", port));
  ASSERT_EQ(peer.line(), "READY\n");
  peer.stop();

  const auto t0 = std::chrono::steady_clock::now();
  rdma_cm_id* client = connect_to(port);
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_UNREACHABLE, kEventLimitMs);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->status, -ETIMEDOUT);
  // Not before every retry had its full wait.
  EXPECT_GE(elapsed_ms(t0), kGiveUpMs - 50);
  rdma_ack_cm_event(ev);

  // The peer, running again, finds the request (once, however many copies
  // wait for it); its answer reaches an id that gave up and changes nothing.
  peer.resume();
  EXPECT_EQ(peer.line(), "REQUEST\n");
  EXPECT_EQ(peer.line(300), "(timeout)") << "a retransmitted REQ made a second request";
  EXPECT_EQ(wait_event(ch_, 300), nullptr);
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST_F(CmTimeout, AcceptSlowerThanTheRequestTimeoutStillConnects) {
  // The peer's CM acknowledges the REQ with an MRA at once; its application
  // accepts a second after the requester would otherwise have given up.
  const uint16_t port = test_port(1);
  Peer peer;
  const std::string delay = std::to_string(kGiveUpMs + 1000);
  ASSERT_TRUE(peer.start("late", port, delay.c_str()));
  ASSERT_EQ(peer.line(), "READY\n");
  rdma_cm_id* client = connect_to(port);
  ASSERT_EQ(peer.line(), "REQUEST\n");
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE, kEventLimitMs + 1000);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_establish(client), 0);
  EXPECT_EQ(peer.line(), "ESTABLISHED\n");
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST_F(CmTimeout, DisconnectFromAStoppedPeerTimesOutIntoDisconnected) {
  const uint16_t port = test_port(2);
  Peer peer;
  ASSERT_TRUE(peer.start("accept", port));
  ASSERT_EQ(peer.line(), "READY\n");
  rdma_cm_id* client = connect_to(port);
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_establish(client), 0);
  ASSERT_EQ(peer.line(), "ESTABLISHED\n");

  peer.stop();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(rdma_disconnect(client), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_DISCONNECTED, kEventLimitMs);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->status, -ETIMEDOUT);
  EXPECT_GE(elapsed_ms(t0), kGiveUpMs - 50);
  rdma_ack_cm_event(ev);
  ev = expect_event(ch_, RDMA_CM_EVENT_TIMEWAIT_EXIT);
  if (ev != nullptr) rdma_ack_cm_event(ev);
  peer.resume();
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST_F(CmTimeout, PassiveSideWithoutRtuIsUnreachable) {
  // Both ends in this process; the active side never calls rdma_establish.
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &listener, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in sin = loopback(0);
  ASSERT_EQ(rdma_bind_addr(listener, sa(sin)), 0);
  ASSERT_EQ(rdma_listen(listener, 4), 0);
  rdma_cm_id* client = connect_to(ntohs(rdma_get_src_port(listener)));
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  rdma_conn_param param{};
  param.qp_num = 0x77;
  ASSERT_EQ(rdma_accept(child, &param), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, client);
  rdma_ack_cm_event(ev);

  ev = expect_event(ch_, RDMA_CM_EVENT_UNREACHABLE, kEventLimitMs);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, child);
  EXPECT_EQ(ev->status, -ETIMEDOUT);
  rdma_ack_cm_event(ev);
  // A late RTU establishes nothing on the passive side.
  EXPECT_EQ(rdma_establish(client), 0);
  EXPECT_EQ(wait_event(ch_, 300), nullptr);

  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(CmTimeout, DestroyingAChannelTearsDownItsIds) {
  // Channel `server` holds a listener, an accepted connection and a request
  // nobody has read yet; the clients are on ch_.
  rdma_event_channel* server = rdma_create_event_channel();
  ASSERT_NE(server, nullptr);
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_id(server, &listener, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in sin = loopback(0);
  ASSERT_EQ(rdma_bind_addr(listener, sa(sin)), 0);
  ASSERT_EQ(rdma_listen(listener, 4), 0);
  const uint16_t port = ntohs(rdma_get_src_port(listener));

  rdma_cm_id* connected = connect_to(port);
  rdma_cm_event* ev = expect_event(server, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  rdma_conn_param param{};
  param.qp_num = 0x77;
  ASSERT_EQ(rdma_accept(child, &param), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_establish(connected), 0);
  ev = expect_event(server, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);

  rdma_cm_id* waiting = connect_to(port);
  pollfd p{server->fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);  // its CONNECT_REQUEST is queued, unread

  rdma_destroy_event_channel(server);

  // The peers hear what they would if the ids had been destroyed.
  bool disconnected = false, rejected = false;
  for (int i = 0; i < 3 && !(disconnected && rejected); ++i) {
    ev = wait_event(ch_);
    ASSERT_NE(ev, nullptr);
    if (ev->id == connected && ev->event == RDMA_CM_EVENT_DISCONNECTED) {
      disconnected = true;
    } else if (ev->id == waiting && ev->event == RDMA_CM_EVENT_REJECTED) {
      EXPECT_EQ(ev->status, 28);
      rejected = true;
    } else {
      EXPECT_EQ(ev->event, RDMA_CM_EVENT_TIMEWAIT_EXIT) << "unexpected " << rdma_event_str(ev->event);
    }
    rdma_ack_cm_event(ev);
  }
  EXPECT_TRUE(disconnected && rejected);

  // The port is free again.
  rdma_cm_id* rebound = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &rebound, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in same = loopback(port);
  EXPECT_EQ(rdma_bind_addr(rebound, sa(same)), 0);

  // The ids left behind fail as on a closed rdma_cm file.
  errno = 0;
  EXPECT_EQ(rdma_listen(listener, 4), -1);
  EXPECT_EQ(errno, EBADF);
  errno = 0;
  EXPECT_EQ(rdma_disconnect(child), -1);
  EXPECT_EQ(errno, EBADF);
  errno = 0;
  EXPECT_EQ(rdma_destroy_id(child), -1);
  EXPECT_EQ(errno, EBADF);
  errno = 0;
  EXPECT_EQ(rdma_destroy_id(listener), -1);
  EXPECT_EQ(errno, EBADF);

  EXPECT_EQ(rdma_destroy_id(rebound), 0);
  EXPECT_EQ(rdma_destroy_id(connected), 0);
  EXPECT_EQ(rdma_destroy_id(waiting), 0);
}

}  // namespace
