// udp_pingpong: the floor under the udp link's latency. A client sends a
// small UDP datagram, the server sends it back, N times; prints the median
// and the 99th percentile of half the round trip (one way), in microseconds.
//
//   udp_pingpong -s [-p PORT]                      server (answers until killed)
//   udp_pingpong -c ADDRESS [-p PORT] [-n N] [-b BYTES]   client
//
// Both ends block in recv, as a process does that sleeps in the kernel
// between packets; busy-polling would be faster and is not what softhca's
// link thread does when idle.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  bool server = false;
  const char* address = nullptr;
  int port = 19800, iterations = 10000, bytes = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-s") server = true;
    else if (a == "-c" && i + 1 < argc) address = argv[++i];
    else if (a == "-p" && i + 1 < argc) port = std::atoi(argv[++i]);
    else if (a == "-n" && i + 1 < argc) iterations = std::atoi(argv[++i]);
    else if (a == "-b" && i + 1 < argc) bytes = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: udp_pingpong -s [-p PORT] | -c ADDRESS [-p PORT] [-n N] [-b BYTES]\n");
      return 2;
    }
  }
  if (!server && address == nullptr) {
    std::fprintf(stderr, "udp_pingpong: -s or -c ADDRESS (see -h)\n");
    return 2;
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  me.sin_family = AF_INET;
  me.sin_port = htons(static_cast<uint16_t>(server ? port : 0));
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me) != 0) {
    std::perror("udp_pingpong: bind");
    return 1;
  }
  std::vector<char> buffer(static_cast<size_t>(std::max(bytes, 1)) + 64);
  if (server) {
    for (;;) {
      sockaddr_in peer{};
      socklen_t len = sizeof peer;
      const ssize_t n = ::recvfrom(fd, buffer.data(), buffer.size(), 0, reinterpret_cast<sockaddr*>(&peer), &len);
      if (n >= 0) ::sendto(fd, buffer.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&peer), len);
    }
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address, &to.sin_addr) != 1) {
    std::fprintf(stderr, "udp_pingpong: bad address %s\n", address);
    return 2;
  }
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::vector<double> one_way;
  one_way.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations + 100; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (::sendto(fd, buffer.data(), static_cast<size_t>(bytes), 0, reinterpret_cast<sockaddr*>(&to), sizeof to) < 0 ||
        ::recv(fd, buffer.data(), buffer.size(), 0) < 0) {
      std::fprintf(stderr, "udp_pingpong: no answer from %s:%d\n", address, port);
      return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 100) one_way.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  std::sort(one_way.begin(), one_way.end());
  std::printf("one-way us: median %.2f p99 %.2f (%d round trips of %d bytes)\n", one_way[one_way.size() / 2],
              one_way[one_way.size() * 99 / 100], iterations, bytes);
  return 0;
}
