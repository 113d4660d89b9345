// What the rsocket loopback tests share: loopback addresses, and a fixture
// that closes every rsocket a test opened and ends a hung test binary.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace softhca::test {

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sin;
}

inline sockaddr* sa(sockaddr_in& sin) { return reinterpret_cast<sockaddr*>(&sin); }

// A blocked rsocket call would otherwise hold the binary until ctest's
// timeout, which names no test: SIGALRM ends it after 50 s with a word on
// stderr (ctest shows the test that was running).
class RsocketFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGALRM, [](int) {
      static const char msg[] = "rsocket test: hung for 50 s\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(3);
    });
    alarm(50);
  }
  void TearDown() override {
    for (int fd : open_) rclose(fd);
    alarm(0);
  }

  // fd closes at the end of the test (a failed rsocket call's -1 is ignored).
  int track(int fd) {
    if (fd >= 0) open_.push_back(fd);
    return fd;
  }
  void forget(int fd) { std::erase(open_, fd); }

  std::vector<int> open_;
};

}  // namespace softhca::test
