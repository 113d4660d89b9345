// RC ping-pong with the softhca C++ API (include/softhca): the shape of
// rdma-core's ibv_rc_pingpong, using the throwing forms throughout.
//
//   server:  cxx_rc_pingpong [-n iters] [-s size]
//   client:  cxx_rc_pingpong [-n iters] [-s size] <server-ip>
//
// The QP numbers, PSNs and GIDs are exchanged over TCP port 18515.
// Each side posts a receive, the client sends first, and every receive
// completion is answered with a send, so each iteration is one round trip.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <softhca/softhca.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr std::uint16_t kPort = 18515;

// Connects to `host`, or accepts one connection when host is null.
int tcp_connect(const char* host) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(kPort);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (host != nullptr) {
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) return -1;
    for (int tries = 0; tries < 50; ++tries) {  // the server may not be listening yet
      if (connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0) return fd;
      usleep(100'000);
    }
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 || listen(fd, 1) != 0) return -1;
  int c = accept(fd, nullptr, nullptr);
  close(fd);
  return c;
}

// Sends ours and receives theirs; both sides run the same code.
softhca::RemoteQp exchange(int fd, const softhca::RemoteQp& mine) {
  softhca::RemoteQp theirs;
  if (write(fd, &mine, sizeof mine) != sizeof mine || read(fd, &theirs, sizeof theirs) != sizeof theirs) {
    std::perror("exchange");
    std::exit(1);
  }
  return theirs;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace softhca;
  int iters = 1000;
  std::size_t size = 4096;
  int opt;
  while ((opt = getopt(argc, argv, "n:s:")) != -1) {
    if (opt == 'n') iters = std::atoi(optarg);
    else if (opt == 's') size = std::strtoul(optarg, nullptr, 0);
    else return 2;
  }
  // Set on the client only: where the server listens.
  const char* server_ip = optind < argc ? argv[optind] : nullptr;

  try {
    // Declaration order is destruction order, reversed: context last.
    auto ctx = Context::make();
    auto pd = ProtectionDomain::make(ctx);
    auto cq = CompletionQueue::make(ctx, 4);
    auto qp = QueuePair::make(pd, cq, cq);
    std::vector<std::byte> buf(size);
    auto mr = MemoryRegion::make(pd, buf, Access::LocalWrite);

    int fd = tcp_connect(server_ip);
    if (fd < 0) {
      std::perror("tcp");
      return 1;
    }
    const std::uint32_t psn = static_cast<std::uint32_t>(getpid()) & 0xffffff;
    RemoteQp mine{.qpn = qp.qpn(), .psn = psn, .gid = value_or_throw(ctx.query_gid(1, 0))};
    RemoteQp peer = exchange(fd, mine);
    value_or_throw(qp.connect(peer, psn, Access::None));
    // The peer must have its first receive posted before we send.
    const std::array sge{mr.sge()};
    value_or_throw(qp.recv(sge, 0));
    char sync = 0;
    if (write(fd, &sync, 1) != 1 || read(fd, &sync, 1) != 1) return 1;

    auto start = std::chrono::steady_clock::now();
    if (server_ip != nullptr) value_or_throw(qp.send(sge, 1));
    int received = 0;
    int outstanding_sends = server_ip != nullptr ? 1 : 0;
    std::array<ibv_wc, 2> wcs{};
    while (received < iters || outstanding_sends > 0) {
      for (const ibv_wc& wc : value_or_throw(cq.poll(wcs))) {
        if (wc.status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "completion %s for wr_id %lu\n", ibv_wc_status_str(wc.status),
                       static_cast<unsigned long>(wc.wr_id));
          return 1;
        }
        if (wc.opcode == IBV_WC_SEND) {
          --outstanding_sends;
          continue;
        }
        ++received;
        if (received < iters) value_or_throw(qp.recv(sge, 0));
        // The server answers every ping; the client sends the next one until done.
        if (received < iters || server_ip == nullptr) {
          value_or_throw(qp.send(sge, 1));
          ++outstanding_sends;
        }
      }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::printf("%d iters of %zu bytes in %.0f us: %.2f us/iter\n", iters, size, us, us / iters);
    close(fd);
  } catch (const VerbsError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
