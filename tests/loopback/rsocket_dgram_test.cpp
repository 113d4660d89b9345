// Datagram rsockets (SOCK_DGRAM, <rdma/rsocket.h>) on our librdmacm.so.1,
// as an application uses them: sockets on 127.0.0.1 inside one process.
// Every wait is bounded: rpoll with a timeout, and an alarm that fails a
// test that hangs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "rsocket_fixture.hpp"

namespace {

using softhca::test::loopback;
using softhca::test::sa;

// Ports of this file: 7600..7649 (tests/system uses 765x for udpong).
constexpr uint16_t kBasePort = 7600;
constexpr int kWaitMs = 10000;

uint8_t pattern(size_t i, uint8_t seed) { return static_cast<uint8_t>(i * 131 + seed); }

std::vector<uint8_t> message(size_t len, uint8_t seed) {
  std::vector<uint8_t> m(len);
  for (size_t i = 0; i < len; ++i) m[i] = pattern(i, seed);
  return m;
}

class RsocketDgram : public softhca::test::RsocketFixture {
 protected:
  int bound(uint16_t port, int type_flags = 0) {
    const int fd = rsocket(AF_INET, SOCK_DGRAM | type_flags, 0);
    EXPECT_GE(fd, 0) << strerror(errno);
    if (track(fd) < 0) return fd;
    sockaddr_in addr = loopback(port);
    EXPECT_EQ(rbind(fd, sa(addr), sizeof addr), 0) << strerror(errno);
    return fd;
  }

  // rpoll for POLLIN (bounded), then one rrecvfrom.
  static ssize_t recv_within(int fd, void* buf, size_t len, int flags = 0, sockaddr_in* from = nullptr) {
    pollfd p{fd, POLLIN, 0};
    if (rpoll(&p, 1, kWaitMs) != 1) return -2;
    socklen_t from_len = sizeof(sockaddr_in);
    return rrecvfrom(fd, buf, len, flags, reinterpret_cast<sockaddr*>(from), from != nullptr ? &from_len : nullptr);
  }

  // `m` from socket `from` to the socket bound on `to_port` (`to`), which
  // receives it whole within the bounded wait.
  static void expect_delivered(int from, int to, uint16_t to_port, const std::vector<uint8_t>& m) {
    sockaddr_in dest = loopback(to_port);
    ASSERT_EQ(rsendto(from, m.data(), m.size(), 0, sa(dest), sizeof dest), static_cast<ssize_t>(m.size()));
    std::vector<uint8_t> got(2048);
    ASSERT_EQ(recv_within(to, got.data(), got.size()), static_cast<ssize_t>(m.size()));
    got.resize(m.size());
    EXPECT_EQ(got, m);
  }

  // One datagram each way, so that both sides know each other's QPN and
  // later datagrams take the UD QPs.
  void handshake(int a, int b, uint16_t a_port) {
    sockaddr_in to_a = loopback(a_port);
    ASSERT_EQ(rsendto(b, "hi", 2, 0, sa(to_a), sizeof to_a), 2) << strerror(errno);
    char buf[16];
    sockaddr_in from{};
    ASSERT_EQ(recv_within(a, buf, sizeof buf, 0, &from), 2);
    ASSERT_EQ(rsendto(a, "ho", 2, 0, sa(from), sizeof from), 2) << strerror(errno);
    ASSERT_EQ(recv_within(b, buf, sizeof buf), 2);
  }
};

TEST_F(RsocketDgram, SendtoAndRecvfromNameTheSender) {
  const int a = bound(kBasePort);
  const int b = bound(kBasePort + 1);
  sockaddr_in to_a = loopback(kBasePort);
  // The first datagrams go by the address service, later ones over UD:
  // the sender's address must come out the same either way.
  for (int round = 0; round < 20; ++round) {
    const auto m = message(64 + round, static_cast<uint8_t>(round));
    ASSERT_EQ(rsendto(b, m.data(), m.size(), 0, sa(to_a), sizeof to_a), static_cast<ssize_t>(m.size()))
        << strerror(errno);
    std::vector<uint8_t> got(2048);
    sockaddr_in from{};
    ASSERT_EQ(recv_within(a, got.data(), got.size(), 0, &from), static_cast<ssize_t>(m.size())) << round;
    got.resize(m.size());
    EXPECT_EQ(got, m);
    EXPECT_EQ(from.sin_family, AF_INET);
    EXPECT_EQ(ntohs(from.sin_port), kBasePort + 1);
    EXPECT_EQ(ntohl(from.sin_addr.s_addr), INADDR_LOOPBACK);

    ASSERT_EQ(rsendto(a, m.data(), m.size(), 0, sa(from), sizeof from), static_cast<ssize_t>(m.size()));
    sockaddr_in back{};
    ASSERT_EQ(recv_within(b, got.data(), got.size(), 0, &back), static_cast<ssize_t>(m.size()));
    EXPECT_EQ(ntohs(back.sin_port), kBasePort);
  }
}

TEST_F(RsocketDgram, ConnectedSocketsUseSendAndRecv) {
  const int server = bound(kBasePort + 2);
  const int client = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(client, 0);
  open_.push_back(client);
  sockaddr_in addr = loopback(kBasePort + 2);
  ASSERT_EQ(rconnect(client, sa(addr), sizeof addr), 0) << strerror(errno);

  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  ASSERT_EQ(rgetpeername(client, reinterpret_cast<sockaddr*>(&peer), &len), 0);
  EXPECT_EQ(ntohs(peer.sin_port), kBasePort + 2);
  sockaddr_in self{};
  len = sizeof self;
  ASSERT_EQ(rgetsockname(client, reinterpret_cast<sockaddr*>(&self), &len), 0);
  EXPECT_NE(self.sin_port, 0);

  for (int i = 0; i < 50; ++i) {
    const auto m = message(16 + i * 20, static_cast<uint8_t>(i));
    ASSERT_EQ(rsend(client, m.data(), m.size(), 0), static_cast<ssize_t>(m.size())) << strerror(errno);
    std::vector<uint8_t> got(2048);
    sockaddr_in from{};
    ASSERT_EQ(recv_within(server, got.data(), got.size(), 0, &from), static_cast<ssize_t>(m.size()));
    EXPECT_EQ(from.sin_port, self.sin_port);
    ASSERT_EQ(rsendto(server, got.data(), m.size(), 0, sa(from), sizeof from), static_cast<ssize_t>(m.size()));
    std::fill(got.begin(), got.end(), 0);
    ASSERT_EQ(recv_within(client, got.data(), got.size()), static_cast<ssize_t>(m.size()));
    got.resize(m.size());
    EXPECT_EQ(got, m);
  }
}

TEST_F(RsocketDgram, MessageBoundariesHold) {
  const int a = bound(kBasePort + 4);
  const int b = bound(kBasePort + 5);
  handshake(a, b, kBasePort + 4);
  sockaddr_in to_a = loopback(kBasePort + 4);
  const size_t sizes[] = {1, 100, 7, 900, 0, 33};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const auto m = message(sizes[i], static_cast<uint8_t>(i));
    ASSERT_EQ(rsendto(b, m.data(), m.size(), 0, sa(to_a), sizeof to_a), static_cast<ssize_t>(m.size()));
  }
  for (size_t i = 0; i < std::size(sizes); ++i) {
    std::vector<uint8_t> got(4096);
    const ssize_t n = recv_within(a, got.data(), got.size());
    ASSERT_EQ(n, static_cast<ssize_t>(sizes[i])) << i;
    got.resize(sizes[i]);
    EXPECT_EQ(got, message(sizes[i], static_cast<uint8_t>(i)));
  }
}

// The largest datagram we carry; anything larger is refused, as UDP
// refuses one beyond its limit.
TEST_F(RsocketDgram, LargestDatagramAndEmsgsize) {
  const int a = bound(kBasePort + 6);
  const int b = bound(kBasePort + 7);
  handshake(a, b, kBasePort + 6);
  sockaddr_in to_a = loopback(kBasePort + 6);
  constexpr size_t kMax = 2048 - 8;  // one receive slot less the IPv4 header
  const auto big = message(kMax, 9);
  ASSERT_EQ(rsendto(b, big.data(), big.size(), 0, sa(to_a), sizeof to_a), static_cast<ssize_t>(kMax))
      << strerror(errno);
  std::vector<uint8_t> got(4096);
  ASSERT_EQ(recv_within(a, got.data(), got.size()), static_cast<ssize_t>(kMax));
  got.resize(kMax);
  EXPECT_EQ(got, big);

  const auto too_big = message(kMax + 1, 1);
  EXPECT_EQ(rsendto(b, too_big.data(), too_big.size(), 0, sa(to_a), sizeof to_a), -1);
  EXPECT_EQ(errno, EMSGSIZE);
}

// A datagram larger than the buffer: the rest is discarded, the next read
// gets the next datagram. MSG_TRUNC asks for the real length (UDP), and
// rrecvmsg flags the cut.
TEST_F(RsocketDgram, LargerThanTheBufferIsTruncated) {
  const int a = bound(kBasePort + 8);
  const int b = bound(kBasePort + 9);
  handshake(a, b, kBasePort + 8);
  sockaddr_in to_a = loopback(kBasePort + 8);
  const auto m1 = message(1000, 1);
  const auto m2 = message(500, 2);
  const auto m3 = message(300, 3);
  ASSERT_EQ(rsendto(b, m1.data(), m1.size(), 0, sa(to_a), sizeof to_a), 1000);
  ASSERT_EQ(rsendto(b, m2.data(), m2.size(), 0, sa(to_a), sizeof to_a), 500);
  ASSERT_EQ(rsendto(b, m3.data(), m3.size(), 0, sa(to_a), sizeof to_a), 300);

  std::vector<uint8_t> small(100);
  ASSERT_EQ(recv_within(a, small.data(), small.size()), 100);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), m1.begin()));

  ASSERT_EQ(recv_within(a, small.data(), small.size(), MSG_TRUNC), 500);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), m2.begin()));

  pollfd p{a, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  iovec iov[2] = {{small.data(), 50}, {small.data() + 50, 50}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  ASSERT_EQ(rrecvmsg(a, &msg, 0), 100);
  EXPECT_TRUE(msg.msg_flags & MSG_TRUNC);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), m3.begin()));
}

TEST_F(RsocketDgram, PeekLeavesTheDatagramQueued) {
  const int a = bound(kBasePort + 10);
  const int b = bound(kBasePort + 11);
  sockaddr_in to_a = loopback(kBasePort + 10);
  ASSERT_EQ(rsendto(b, "peekaboo", 8, 0, sa(to_a), sizeof to_a), 8);
  char buf[16] = {};
  ASSERT_EQ(recv_within(a, buf, 4, MSG_PEEK), 4);
  EXPECT_EQ(std::memcmp(buf, "peek", 4), 0);
  ASSERT_EQ(recv_within(a, buf, sizeof buf), 8);
  EXPECT_EQ(std::memcmp(buf, "peekaboo", 8), 0);
  EXPECT_EQ(rrecv(a, buf, sizeof buf, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(RsocketDgram, NonblockingSaysEagain) {
  const int a = bound(kBasePort + 12, SOCK_NONBLOCK);
  char buf[16];
  EXPECT_EQ(rrecv(a, buf, sizeof buf, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_TRUE(rfcntl(a, F_GETFL) & O_NONBLOCK);

  const int b = bound(kBasePort + 13);
  EXPECT_FALSE(rfcntl(b, F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(rrecvfrom(b, buf, sizeof buf, MSG_DONTWAIT, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(rfcntl(b, F_SETFL, O_NONBLOCK), 0);
  EXPECT_TRUE(rfcntl(b, F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(rrecv(b, buf, sizeof buf, 0), -1);
  EXPECT_EQ(errno, EAGAIN);

  // Data then makes the nonblocking receive succeed.
  sockaddr_in to_a = loopback(kBasePort + 12);
  ASSERT_EQ(rsendto(b, "x", 1, 0, sa(to_a), sizeof to_a), 1);
  EXPECT_EQ(recv_within(a, buf, sizeof buf), 1);
}

TEST_F(RsocketDgram, PollAndSelectReportReadiness) {
  const int a = bound(kBasePort + 14);
  const int b = bound(kBasePort + 15);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);

  pollfd p[2] = {{a, POLLIN | POLLOUT, 0}, {pipe_fds[0], POLLIN, 0}};
  ASSERT_EQ(rpoll(p, 2, 0), 1);
  EXPECT_EQ(p[0].revents, POLLOUT);
  EXPECT_EQ(p[1].revents, 0);

  p[0].events = POLLIN;
  EXPECT_EQ(rpoll(p, 2, 0), 0);

  sockaddr_in to_a = loopback(kBasePort + 14);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(rsendto(b, "data", 4, 0, sa(to_a), sizeof to_a), 4);
    ASSERT_EQ(rpoll(p, 2, kWaitMs), 1) << round;
    EXPECT_EQ(p[0].revents, POLLIN);
    char buf[8];
    ASSERT_EQ(rrecv(a, buf, sizeof buf, 0), 4);
    EXPECT_EQ(rpoll(p, 2, 0), 0);
  }

  // The ordinary descriptor still wakes an rpoll that waits on both.
  ASSERT_EQ(write(pipe_fds[1], "p", 1), 1);
  ASSERT_EQ(rpoll(p, 2, kWaitMs), 1);
  EXPECT_EQ(p[1].revents, POLLIN);

  ASSERT_EQ(rsendto(b, "data", 4, 0, sa(to_a), sizeof to_a), 4);
  fd_set rd;
  FD_ZERO(&rd);
  FD_SET(a, &rd);
  timeval tv{10, 0};
  ASSERT_EQ(rselect(a + 1, &rd, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(a, &rd));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

// A blocking receive sleeps until a datagram comes, whichever of the two
// threads gets there first.
TEST_F(RsocketDgram, BlockingReceiveWakesForData) {
  const int a = bound(kBasePort + 16);
  const int b = bound(kBasePort + 17);
  handshake(a, b, kBasePort + 16);
  for (int round = 0; round < 2; ++round) {
    ssize_t got = 0;
    char buf[64];
    std::thread reader([&] { got = rrecv(a, buf, sizeof buf, 0); });
    sockaddr_in to_a = loopback(kBasePort + 16);
    ASSERT_EQ(rsendto(b, "wake up", 7, 0, sa(to_a), sizeof to_a), 7);
    reader.join();
    EXPECT_EQ(got, 7);
    EXPECT_EQ(std::memcmp(buf, "wake up", 7), 0);
  }
}

// Ping-pong many datagrams (never more than one in flight, so none may
// be lost): every one intact, from the right sender.
TEST_F(RsocketDgram, ManyRoundTripsStayIntact) {
  const int server = bound(kBasePort + 18);
  const int c1 = bound(kBasePort + 19);
  const int c2 = bound(kBasePort + 20);
  sockaddr_in to_server = loopback(kBasePort + 18);
  for (int i = 0; i < 400; ++i) {
    const int client = i % 2 == 0 ? c1 : c2;
    const auto m = message(static_cast<size_t>(i * 37 % 1500 + 1), static_cast<uint8_t>(i));
    ASSERT_EQ(rsendto(client, m.data(), m.size(), 0, sa(to_server), sizeof to_server),
              static_cast<ssize_t>(m.size()));
    std::vector<uint8_t> got(2048);
    sockaddr_in from{};
    ASSERT_EQ(recv_within(server, got.data(), got.size(), 0, &from), static_cast<ssize_t>(m.size())) << i;
    EXPECT_EQ(ntohs(from.sin_port), i % 2 == 0 ? kBasePort + 19 : kBasePort + 20);
    ASSERT_EQ(rsendto(server, got.data(), m.size(), 0, sa(from), sizeof from), static_cast<ssize_t>(m.size()));
    std::fill(got.begin(), got.end(), 0);
    ASSERT_EQ(recv_within(client, got.data(), got.size()), static_cast<ssize_t>(m.size())) << i;
    got.resize(m.size());
    ASSERT_EQ(got, m) << i;
  }
}

TEST_F(RsocketDgram, ErrnoConventions) {
  const int fresh = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fresh, 0);
  open_.push_back(fresh);
  char buf[16];
  // Never given an address: nothing can arrive (rdma-core says EINVAL).
  EXPECT_EQ(rrecv(fresh, buf, sizeof buf, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  // Not connected and no destination.
  EXPECT_EQ(rsend(fresh, "x", 1, 0), -1);
  EXPECT_EQ(errno, EDESTADDRREQ);
  // Stream-only calls, as on a UDP socket.
  EXPECT_EQ(rlisten(fresh, 4), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(raccept(fresh, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // A destination of another family, or too short.
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  EXPECT_EQ(rsendto(fresh, "x", 1, 0, reinterpret_cast<sockaddr*>(&six), sizeof six), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  sockaddr_in to = loopback(kBasePort + 21);
  EXPECT_EQ(rsendto(fresh, "x", 1, 0, sa(to), 4), -1);
  EXPECT_EQ(errno, EINVAL);
  // Shutdown of an unconnected datagram socket, as UDP.
  EXPECT_EQ(rshutdown(fresh, SHUT_RDWR), -1);
  EXPECT_EQ(errno, ENOTCONN);

  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), -1);
  EXPECT_EQ(errno, EPROTONOSUPPORT);
  EXPECT_EQ(rsocket(AF_INET, SOCK_RAW, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_GE(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_UDP), 0);  // closed by exit

  // A port another socket holds.
  const int a = bound(kBasePort + 22);
  ASSERT_GE(a, 0);
  const int b = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(b, 0);
  open_.push_back(b);
  sockaddr_in same = loopback(kBasePort + 22);
  EXPECT_EQ(rbind(b, sa(same), sizeof same), -1);
  EXPECT_EQ(errno, EADDRINUSE);

  int type = 0;
  socklen_t len = sizeof type;
  ASSERT_EQ(rgetsockopt(a, SOL_SOCKET, SO_TYPE, &type, &len), 0);
  EXPECT_EQ(type, SOCK_DGRAM);
}

TEST_F(RsocketDgram, ShutdownOfAConnectedSocket) {
  const int server = bound(kBasePort + 23);
  const int client = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(client, 0);
  open_.push_back(client);
  sockaddr_in addr = loopback(kBasePort + 23);
  ASSERT_EQ(rconnect(client, sa(addr), sizeof addr), 0);
  ASSERT_EQ(rshutdown(client, SHUT_WR), 0);
  EXPECT_EQ(rsend(client, "x", 1, 0), -1);
  EXPECT_EQ(errno, EPIPE);
  ASSERT_EQ(rshutdown(client, SHUT_RD), 0);
  char buf[4];
  EXPECT_EQ(rrecv(client, buf, sizeof buf, 0), 0);  // no longer readable: at once
  pollfd p{client, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 1);
  (void)server;
}

// Short queues (8 entries from 8 KiB buffers) and datagrams in fragments.
TEST_F(RsocketDgram, SmallBuffersAndFragments) {
  int size = 8192;
  std::vector<int> fds;
  for (uint16_t port : {uint16_t(kBasePort + 24), uint16_t(kBasePort + 25)}) {
    const int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(fd, 0);
    open_.push_back(fd);
    ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size), 0);
    ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size), 0);
    sockaddr_in addr = loopback(port);
    ASSERT_EQ(rbind(fd, sa(addr), sizeof addr), 0);
    fds.push_back(fd);
  }
  const int a = fds[0], b = fds[1];
  handshake(a, b, kBasePort + 24);
  sockaddr_in to_a = loopback(kBasePort + 24);
  for (int i = 0; i < 300; ++i) {
    const auto m = message(1800 + i % 200, static_cast<uint8_t>(i));
    ASSERT_EQ(rsendto(b, m.data(), m.size(), 0, sa(to_a), sizeof to_a), static_cast<ssize_t>(m.size()));
    std::vector<uint8_t> got(2048);
    sockaddr_in from{};
    ASSERT_EQ(recv_within(a, got.data(), got.size(), 0, &from), static_cast<ssize_t>(m.size())) << i;
    ASSERT_EQ(rsendto(a, got.data(), m.size(), 0, sa(from), sizeof from), static_cast<ssize_t>(m.size()));
    std::fill(got.begin(), got.end(), 0);
    ASSERT_EQ(recv_within(b, got.data(), got.size()), static_cast<ssize_t>(m.size())) << i;
    got.resize(m.size());
    ASSERT_EQ(got, m) << i;
  }
}

// One socket, two threads: a receive blocked in one while the other sends
// from the same socket to its own address (first by the address service,
// then over its own QP).
TEST_F(RsocketDgram, ThreadsShareASocketThatSendsToItself) {
  const int a = bound(kBasePort + 26);
  sockaddr_in self = loopback(kBasePort + 26);
  for (int round = 0; round < 20; ++round) {
    ssize_t got = -1;
    sockaddr_in from{};
    std::vector<uint8_t> buf(2048);
    std::thread reader([&] {
      socklen_t len = sizeof from;
      got = rrecvfrom(a, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    });
    const auto m = message(static_cast<size_t>(round * 97 + 1), static_cast<uint8_t>(round));
    ASSERT_EQ(rsendto(a, m.data(), m.size(), 0, sa(self), sizeof self), static_cast<ssize_t>(m.size()));
    reader.join();
    ASSERT_EQ(got, static_cast<ssize_t>(m.size())) << round;
    buf.resize(m.size());
    EXPECT_EQ(buf, m);
    EXPECT_EQ(ntohs(from.sin_port), kBasePort + 26);
  }
}

// rpoll never gives up before its timeout, as poll(2) never does. udpong's
// echo client sends, waits in rpoll(..., 1 ms) and resends when that
// returns 0; every early 0 left one more duplicate echo in flight for the
// rest of the run, and the run slowed by 10-20x. The deadline was kept in
// whole milliseconds, so a call made late in a millisecond returned 0
// within microseconds: each call here starts in the last microsecond of
// one, on an idle socket and on one with a QP whose CQ is armed.
TEST_F(RsocketDgram, PollTimeoutIsNeverCutShort) {
  const int idle = bound(kBasePort + 27);
  const int a = bound(kBasePort + 28);
  const int b = bound(kBasePort + 29);
  handshake(a, b, kBasePort + 28);
  auto now_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  };
  int early = 0;
  for (int round = 0; round < 100; ++round) {
    int64_t start;
    do start = now_ns();
    while (start % 1'000'000 < 999'000);
    pollfd p{round % 2 == 0 ? idle : a, POLLIN, 0};
    ASSERT_EQ(rpoll(&p, 1, 1), 0) << round;
    if (now_ns() - start < 1'000'000) ++early;
  }
  EXPECT_EQ(early, 0);
}

// A datagram numbered `seq`: its number, then bytes that depend on it.
std::vector<uint8_t> numbered(uint32_t seq, size_t len) {
  std::vector<uint8_t> m = message(len, static_cast<uint8_t>(seq));
  std::memcpy(m.data(), &seq, sizeof seq);
  return m;
}

// Whether `got` is numbered(seq, got.size()) for its own number; that number.
bool intact(const std::vector<uint8_t>& got, uint32_t* seq) {
  if (got.size() < sizeof *seq) return false;
  std::memcpy(seq, got.data(), sizeof *seq);
  return got == numbered(*seq, got.size());
}

// A sender that floods a socket nobody reads: its sends never block or fail
// (UD drops what finds no receive slot, as UDP drops what finds no room),
// and whatever the reader finds afterwards is whole, in order, and followed
// by fresh datagrams once it has read.
TEST_F(RsocketDgram, AFloodIntoAnUnreadSocketLeavesOnlyWholeDatagramsInOrder) {
  const int a = bound(kBasePort + 30);
  const int b = bound(kBasePort + 31);
  handshake(a, b, kBasePort + 30);
  sockaddr_in to_a = loopback(kBasePort + 30);
  constexpr uint32_t kFlood = 5000;
  for (uint32_t seq = 0; seq < kFlood; ++seq) {
    const auto m = numbered(seq, 16 + seq % 1000);
    ASSERT_EQ(rsendto(b, m.data(), m.size(), 0, sa(to_a), sizeof to_a), static_cast<ssize_t>(m.size())) << seq;
  }
  uint32_t received = 0;
  int64_t last = -1;
  for (;;) {
    std::vector<uint8_t> got(2048);
    const ssize_t n = rrecv(a, got.data(), got.size(), MSG_DONTWAIT);
    if (n < 0) {
      ASSERT_EQ(errno, EAGAIN);
      break;
    }
    got.resize(static_cast<size_t>(n));
    uint32_t seq = 0;
    ASSERT_TRUE(intact(got, &seq)) << "datagram " << received;
    ASSERT_GT(int64_t{seq}, last);
    last = seq;
    ++received;
  }
  EXPECT_GT(received, 0u);
  EXPECT_LT(received, kFlood);  // the receive queue (384 slots) cannot hold them all
  // Read slots are posted again: the socket still receives.
  expect_delivered(b, a, kBasePort + 30, numbered(kFlood, 100));
}

// The peer process dies (SIGKILL) while datagrams flow to it: the sender's
// calls neither hang nor fail (a datagram to nobody is simply lost), and
// the same socket goes on talking to a live peer.
TEST_F(RsocketDgram, APeerKilledMidTrafficLeavesTheSenderWorking) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A receiver that reads forever: its socket, QP and memory vanish with it.
    // It dies with this test's process too: a test killed by its timeout or
    // by a sanitizer never runs the reaper below, and the child, still
    // bound to its port, failed every later run of this test.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(3);
    close(ready[0]);
    const int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr = loopback(kBasePort + 32);
    if (fd < 0 || rbind(fd, sa(addr), sizeof addr) != 0) _exit(2);
    (void)!write(ready[1], "r", 1);
    char buf[2048];
    for (;;) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      const ssize_t n = rrecvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n > 0) (void)rsendto(fd, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), len);
    }
  }
  close(ready[1]);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  char r = 0;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  close(ready[0]);
  const int a = bound(kBasePort + 33);
  sockaddr_in to_child = loopback(kBasePort + 32);
  // Echoes first, so that the sender knows the child's QP and uses it.
  for (uint32_t seq = 0; seq < 20; ++seq) {
    const auto m = numbered(seq, 64);
    ASSERT_EQ(rsendto(a, m.data(), m.size(), 0, sa(to_child), sizeof to_child), 64);
    std::vector<uint8_t> got(2048);
    ASSERT_EQ(recv_within(a, got.data(), got.size()), 64) << seq;
  }
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    killed = true;
  });
  uint32_t seq = 20;
  while (!killed.load()) {
    const auto m = numbered(seq++, 64);
    ASSERT_EQ(rsendto(a, m.data(), m.size(), 0, sa(to_child), sizeof to_child), 64);
  }
  killer.join();
  for (int i = 0; i < 1000; ++i, ++seq) {
    const auto m = numbered(seq, 64);
    ASSERT_EQ(rsendto(a, m.data(), m.size(), 0, sa(to_child), sizeof to_child), 64) << i;
  }
  // Echoes the child sent before it died may still be queued: read them away.
  std::vector<uint8_t> drain(2048);
  while (rrecv(a, drain.data(), drain.size(), MSG_DONTWAIT) > 0) {
  }
  const int b = bound(kBasePort + 34);
  handshake(a, b, kBasePort + 33);
  expect_delivered(a, b, kBasePort + 34, numbered(seq, 512));
}

// One thread sends while another closes the socket under it: a call that
// overlaps the close completes, or fails with EBADF (the descriptor went
// first) or EPIPE (the socket stopped sending first); it never touches freed
// memory (ASan watches); and a call made after rclose returned fails with
// EBADF.
TEST_F(RsocketDgram, ClosingASocketWhileAnotherThreadSendsIsSafe) {
  for (int round = 0; round < 20; ++round) {
    const int a = rsocket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(a, 0);
    sockaddr_in addr = loopback(kBasePort + 35);
    ASSERT_EQ(rbind(a, sa(addr), sizeof addr), 0) << strerror(errno);
    const int b = bound(kBasePort + 36);
    sockaddr_in to_b = loopback(kBasePort + 36);
    std::atomic<int> sent{0};
    std::atomic<bool> closed{false};
    int overlapping_errno = 0;  // of a failed call that began before the close returned
    int after_errno = 0;        // of the first call begun after it
    ssize_t after_result = 0;
    std::thread sender([&] {
      for (;;) {
        const bool after_close = closed.load();
        const auto m = numbered(static_cast<uint32_t>(sent.load()), 200);
        const ssize_t n = rsendto(a, m.data(), m.size(), 0, sa(to_b), sizeof to_b);
        const int error = n < 0 ? errno : 0;
        if (after_close) {
          after_result = n;
          after_errno = error;
          return;
        }
        if (n < 0 && overlapping_errno == 0) overlapping_errno = error;
        if (n >= 0) ++sent;
      }
    });
    while (sent.load() < 50 + round * 10) std::this_thread::yield();
    ASSERT_EQ(rclose(a), 0);
    closed = true;
    sender.join();
    EXPECT_TRUE(overlapping_errno == 0 || overlapping_errno == EBADF || overlapping_errno == EPIPE)
        << "a send that overlapped rclose failed with " << strerror(overlapping_errno);
    EXPECT_EQ(after_result, -1) << "a send after rclose returned succeeded";
    EXPECT_EQ(after_errno, EBADF);
    // Whatever reached b is whole.
    std::vector<uint8_t> got(2048);
    for (ssize_t n; (n = rrecv(b, got.data(), got.size(), MSG_DONTWAIT)) > 0; got.resize(2048)) {
      got.resize(static_cast<size_t>(n));
      uint32_t seq = 0;
      EXPECT_TRUE(intact(got, &seq));
    }
    forget(b);
    ASSERT_EQ(rclose(b), 0);
  }
}

}  // namespace
