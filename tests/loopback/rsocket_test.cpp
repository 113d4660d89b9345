// Stream rsockets (<rdma/rsocket.h>) on our librdmacm.so.1, as an
// application uses them: pairs connected on 127.0.0.1 inside one process
// (and one test against a peer process it kills). Every wait is bounded:
// rpoll with a timeout, and an alarm that fails a test that hangs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rsocket_fixture.hpp"

extern char** environ;

namespace {

using softhca::test::loopback;
using softhca::test::sa;

// Ports of this file: 7500..7539 (tests/system uses 755x for rsockets).
constexpr uint16_t kBasePort = 7500;

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 9)); }

class Rsocket : public softhca::test::RsocketFixture {
 protected:
  int listener(uint16_t port, int iomap_size = 0) {
    const int fd = track(rsocket(AF_INET, SOCK_STREAM, 0));
    EXPECT_GE(fd, 0) << strerror(errno);
    if (iomap_size != 0) {
      EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &iomap_size, sizeof iomap_size), 0);
    }
    int one = 1;
    EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    sockaddr_in addr = loopback(port);
    EXPECT_EQ(rbind(fd, sa(addr), sizeof addr), 0) << strerror(errno);
    EXPECT_EQ(rlisten(fd, 8), 0) << strerror(errno);
    return fd;
  }

  // A connected pair in one thread: a nonblocking connect, the accept,
  // then rpoll until the connect completes. {client, server}.
  std::pair<int, int> connected_pair(uint16_t port, int iomap_size = 0) {
    const int lfd = listener(port, iomap_size);
    const int c = track(rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    EXPECT_GE(c, 0);
    if (iomap_size != 0) {
      EXPECT_EQ(rsetsockopt(c, SOL_RDMA, RDMA_IOMAPSIZE, &iomap_size, sizeof iomap_size), 0);
    }
    sockaddr_in addr = loopback(port);
    EXPECT_EQ(rconnect(c, sa(addr), sizeof addr), -1);
    EXPECT_EQ(errno, EINPROGRESS);
    pollfd lp{lfd, POLLIN, 0};
    EXPECT_EQ(rpoll(&lp, 1, 10000), 1);
    const int s = track(raccept(lfd, nullptr, nullptr));
    EXPECT_GE(s, 0) << strerror(errno);
    pollfd cp{c, POLLOUT, 0};
    EXPECT_EQ(rpoll(&cp, 1, 10000), 1);
    EXPECT_TRUE(cp.revents & POLLOUT);
    int err = -1;
    socklen_t len = sizeof err;
    EXPECT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
    EXPECT_EQ(err, 0);
    // Blocking from here on, as most applications are.
    EXPECT_EQ(rfcntl(c, F_SETFL, 0), 0);
    return {c, s};
  }
};

bool send_all(int fd, const uint8_t* data, size_t len) {
  while (len != 0) {
    const ssize_t n = rsend(fd, data, len, 0);
    if (n <= 0) return false;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool recv_all(int fd, uint8_t* data, size_t len) {
  while (len != 0) {
    const ssize_t n = rrecv(fd, data, len, 0);
    if (n <= 0) return false;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Sizes from one byte to several times the 256 KiB receive buffer, each
// byte checked, both directions at once.
TEST_F(Rsocket, StreamIntegrityAcrossSizes) {
  auto [c, s] = connected_pair(kBasePort);
  for (size_t size : {size_t{1}, size_t{63}, size_t{4096}, size_t{65537}, size_t{1} << 20, size_t{3} << 20}) {
    std::vector<uint8_t> out(size), back(size), in(size);
    for (size_t i = 0; i < size; ++i) out[i] = pattern(i + size);
    std::thread echo([&, s = s] {
      // The server sends the same bytes back while still receiving.
      ASSERT_TRUE(recv_all(s, in.data(), size));
      ASSERT_TRUE(send_all(s, in.data(), size));
    });
    ASSERT_TRUE(send_all(c, out.data(), size)) << size;
    ASSERT_TRUE(recv_all(c, back.data(), size)) << size;
    echo.join();
    EXPECT_EQ(in, out) << size;
    EXPECT_EQ(back, out) << size;
  }
}

TEST_F(Rsocket, VectorsAndPeek) {
  auto [c, s] = connected_pair(kBasePort + 1);
  char a[] = "hello, ", b[] = "rsockets";
  iovec iov[2] = {{a, 7}, {b, 8}};
  ASSERT_EQ(rwritev(c, iov, 2), 15);
  char peek[32] = {};
  pollfd p{s, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  ASSERT_GT(rrecv(s, peek, 5, MSG_PEEK), 0);
  EXPECT_EQ(std::string(peek, 5), "hello");
  char got[32] = {};
  ASSERT_EQ(rrecv(s, got, 15, MSG_WAITALL), 15);
  EXPECT_EQ(std::string(got, 15), "hello, rsockets");
}

TEST_F(Rsocket, NonblockingReceiveAndSendSayEagain) {
  auto [c, s] = connected_pair(kBasePort + 2);
  ASSERT_EQ(rfcntl(s, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(s, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
  char byte;
  EXPECT_EQ(rrecv(s, &byte, 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(rrecv(c, &byte, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);

  // Nobody reads: the sender runs out of granted buffer and says EAGAIN.
  std::vector<uint8_t> chunk(64 * 1024, 0x5A);
  size_t sent = 0;
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = rsend(c, chunk.data(), chunk.size(), MSG_DONTWAIT);
    if (n < 0) {
      EXPECT_EQ(errno, EAGAIN);
      break;
    }
    sent += static_cast<size_t>(n);
  }
  EXPECT_GT(sent, 0u);
  EXPECT_LT(sent, 1000 * chunk.size()) << "never ran out of space";
  pollfd p{c, POLLOUT, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 0) << "writable with no space";

  // Reading it all makes the sender writable again.
  std::vector<uint8_t> in(sent);
  ASSERT_EQ(rfcntl(s, F_SETFL, 0), 0);
  ASSERT_TRUE(recv_all(s, in.data(), sent));
  EXPECT_EQ(rpoll(&p, 1, 5000), 1);
  EXPECT_TRUE(p.revents & POLLOUT);
}

TEST_F(Rsocket, PollMixesRsocketsAndOrdinaryFds) {
  auto [c, s] = connected_pair(kBasePort + 3);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pollfd fds[2] = {{s, POLLIN, 0}, {pipefd[0], POLLIN, 0}};
  // Idle: the timeout expires, about on time.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rpoll(fds, 2, 200), 0);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(190));
  EXPECT_LT(waited, std::chrono::seconds(3));

  // The ordinary fd wakes a sleeping rpoll.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)!write(pipefd[1], "x", 1);
  });
  EXPECT_EQ(rpoll(fds, 2, 5000), 1);
  EXPECT_EQ(fds[0].revents, 0);
  EXPECT_TRUE(fds[1].revents & POLLIN);
  writer.join();
  char x;
  ASSERT_EQ(read(pipefd[0], &x, 1), 1);

  // So does data on the rsocket.
  std::thread sender([&, c = c] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(rsend(c, "y", 1, 0), 1);
  });
  EXPECT_EQ(rpoll(fds, 2, 5000), 1);
  EXPECT_TRUE(fds[0].revents & POLLIN);
  EXPECT_EQ(fds[1].revents, 0);
  sender.join();

  // rselect sees the same.
  fd_set rd;
  FD_ZERO(&rd);
  FD_SET(s, &rd);
  FD_SET(pipefd[0], &rd);
  timeval tv{2, 0};
  EXPECT_EQ(rselect(std::max(s, pipefd[0]) + 1, &rd, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(s, &rd));
  EXPECT_FALSE(FD_ISSET(pipefd[0], &rd));
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(Rsocket, ShutdownWriteGivesEofAndKeepsTheOtherWay) {
  auto [c, s] = connected_pair(kBasePort + 4);
  ASSERT_EQ(rsend(c, "last", 4, 0), 4);
  ASSERT_EQ(rshutdown(c, SHUT_WR), 0);
  char buf[8];
  ASSERT_EQ(rrecv(s, buf, sizeof buf, MSG_WAITALL), 4);
  EXPECT_EQ(rrecv(s, buf, sizeof buf, 0), 0) << "no EOF after SHUT_WR";
  EXPECT_EQ(rsend(c, "x", 1, 0), -1);
  EXPECT_EQ(errno, EPIPE);
  // The server may still answer.
  ASSERT_EQ(rsend(s, "reply", 5, 0), 5);
  ASSERT_EQ(rrecv(c, buf, 5, MSG_WAITALL), 5);
  EXPECT_EQ(std::string(buf, 5), "reply");
  ASSERT_EQ(rshutdown(s, SHUT_WR), 0);
  EXPECT_EQ(rrecv(c, buf, sizeof buf, 0), 0);
}

TEST_F(Rsocket, CloseGivesPeerEofAndHangup) {
  auto [c, s] = connected_pair(kBasePort + 5);
  ASSERT_EQ(rsend(s, "bye", 3, 0), 3);
  ASSERT_EQ(rclose(s), 0);
  forget(s);
  char buf[8];
  ASSERT_EQ(rrecv(c, buf, sizeof buf, MSG_WAITALL), 3) << "data sent before close is lost";
  EXPECT_EQ(rrecv(c, buf, sizeof buf, 0), 0);
  pollfd p{c, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 1000), 1);
  EXPECT_TRUE(p.revents & POLLHUP);
}

TEST_F(Rsocket, ManySocketsAtOnce) {
  constexpr int kPairs = 12;
  const int lfd = listener(kBasePort + 6);
  std::vector<int> clients, servers;
  sockaddr_in addr = loopback(kBasePort + 6);
  for (int i = 0; i < kPairs; ++i) {
    const int c = track(rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    ASSERT_GE(c, 0);
    ASSERT_EQ(rconnect(c, sa(addr), sizeof addr), -1);
    ASSERT_EQ(errno, EINPROGRESS);
    clients.push_back(c);
  }
  for (int i = 0; i < kPairs; ++i) {
    const int s = track(raccept(lfd, nullptr, nullptr));
    ASSERT_GE(s, 0) << strerror(errno);
    servers.push_back(s);
  }
  // Each client says its index; every server gets exactly one of them.
  std::vector<pollfd> fds;
  for (int i = 0; i < kPairs; ++i) fds.push_back({clients[i], POLLOUT, 0});
  for (int ready = 0; ready < kPairs;) {
    ASSERT_GT(rpoll(fds.data(), fds.size(), 10000), 0);
    for (auto& p : fds) {
      if (p.fd >= 0 && (p.revents & POLLOUT)) {
        const auto index = static_cast<uint8_t>(&p - fds.data());
        ASSERT_EQ(rsend(p.fd, &index, 1, 0), 1);
        p.fd = -1;
        ++ready;
      }
    }
  }
  std::vector<int> seen(kPairs, 0);
  for (int s : servers) {
    uint8_t index = 0xFF;
    ASSERT_EQ(rfcntl(s, F_SETFL, 0), 0);
    ASSERT_EQ(rrecv(s, &index, 1, 0), 1);
    ASSERT_LT(index, kPairs);
    ++seen[index];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
}

// riomap on the server, riowrite from the client at offsets inside the
// mapping, a message after it: the bytes are there when the message is.
TEST_F(Rsocket, RiowriteLandsInThePeersMapping) {
  auto [c, s] = connected_pair(kBasePort + 9, 1);
  std::vector<uint8_t> window(256 * 1024, 0);
  ASSERT_EQ(riomap(s, window.data(), window.size(), PROT_WRITE, 0, 4096), 4096) << strerror(errno);
  // The mapping is announced with the server's next send.
  ASSERT_EQ(rsend(s, "m", 1, 0), 1);
  char m;
  ASSERT_EQ(rrecv(c, &m, 1, 0), 1);
  std::vector<uint8_t> data(200 * 1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = pattern(i);
  ASSERT_EQ(riowrite(c, data.data(), data.size(), 4096 + 1000, 0), data.size()) << strerror(errno);
  // Outside every mapping: nothing is written.
  EXPECT_EQ(riowrite(c, data.data(), 10, 1, 0), 0u);
  ASSERT_EQ(rsend(c, "d", 1, 0), 1);
  ASSERT_EQ(rrecv(s, &m, 1, 0), 1);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), window.begin() + 1000));
  EXPECT_EQ(window[999], 0);
  EXPECT_EQ(riounmap(s, window.data(), window.size()), 0);
  EXPECT_EQ(riounmap(s, window.data(), window.size()), -1);
  EXPECT_EQ(errno, EINVAL);
}

// Sending on a nonblocking socket whose connect is under way: EAGAIN until
// the server accepts, then the data goes (no ENOTCONN in between).
TEST_F(Rsocket, SendDuringNonblockingConnectSaysEagain) {
  const int lfd = listener(kBasePort + 10);
  const int c = track(rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
  sockaddr_in addr = loopback(kBasePort + 10);
  ASSERT_EQ(rconnect(c, sa(addr), sizeof addr), -1);
  ASSERT_EQ(errno, EINPROGRESS);
  EXPECT_EQ(rsend(c, "x", 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  const int s = track(raccept(lfd, nullptr, nullptr));
  ASSERT_GE(s, 0);
  ssize_t n = -1;
  for (int i = 0; i < 1000 && n < 0; ++i) {
    n = rsend(c, "x", 1, 0);
    if (n < 0) {
      ASSERT_EQ(errno, EAGAIN);
      pollfd p{c, POLLOUT, 0};
      rpoll(&p, 1, 100);
    }
  }
  ASSERT_EQ(n, 1);
  char got;
  ASSERT_EQ(rrecv(s, &got, 1, 0), 1);
  EXPECT_EQ(got, 'x');
}

TEST_F(Rsocket, ConnectToNobodyFailsCleanly) {
  const int c = track(rsocket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr = loopback(kBasePort + 7);
  EXPECT_EQ(rconnect(c, sa(addr), sizeof addr), -1);
  EXPECT_TRUE(errno == ECONNREFUSED || errno == ETIMEDOUT || errno == EHOSTUNREACH) << strerror(errno);
}

TEST_F(Rsocket, ErrnoConventions) {
  char byte;
  EXPECT_EQ(rrecv(12345, &byte, 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rclose(12345), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  const int fd = track(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(fd, 0);
  EXPECT_EQ(rsend(fd, "x", 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(rrecv(fd, &byte, 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  int v = 0;
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_BROADCAST, &v, sizeof v), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  // The number is a descriptor of the process, so no other open() gets it.
  EXPECT_NE(fcntl(fd, F_GETFD), -1);
}

// A peer process killed mid-connection: the survivor's blocking receive
// ends (EOF or an error) instead of hanging. The peer is Debian's rstream
// on our libraries; it connects, sends its 16-byte sync and waits.
TEST_F(Rsocket, PeerDeathEndsABlockedReceive) {
  const char* rstream = "/usr/bin/rstream";
  if (access(rstream, X_OK) != 0) GTEST_SKIP() << "rdmacm-utils' rstream is not installed";
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an uninstrumented rstream cannot load our sanitizer-built libraries";
#endif
  const uint16_t port = kBasePort + 8;
  const int lfd = listener(port);
  std::string libpath = std::string("LD_LIBRARY_PATH=") + SOFTHCA_LIBDIR;
  std::vector<std::string> env_strings{libpath};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("LD_LIBRARY_PATH=", 0) != 0) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string port_arg = std::to_string(port);
  const char* argv[] = {rstream, "-s", "127.0.0.1", "-p", port_arg.c_str(), "-S", "1000", "-C", "100", nullptr};
  pid_t child = -1;
  ASSERT_EQ(posix_spawn(&child, rstream, nullptr, nullptr, const_cast<char**>(argv), envp.data()), 0);
  pollfd lp{lfd, POLLIN, 0};
  ASSERT_EQ(rpoll(&lp, 1, 10000), 1);
  const int s = track(raccept(lfd, nullptr, nullptr));
  ASSERT_GE(s, 0) << strerror(errno);
  uint8_t sync[16];
  ASSERT_TRUE(recv_all(s, sync, sizeof sync));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);

  const auto t0 = std::chrono::steady_clock::now();
  uint8_t byte;
  const ssize_t n = rrecv(s, &byte, 1, 0);
  EXPECT_LE(n, 0);
  if (n < 0) {
    EXPECT_TRUE(errno == ECONNRESET || errno == ETIMEDOUT || errno == EPIPE) << strerror(errno);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(40));
}

}  // namespace
