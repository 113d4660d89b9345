// integrity_peer: the data-integrity test of every opcode and size between
// two hosts, as two processes that share nothing but a TCP connection and
// the RDMA link (plain verbs, the out-of-band exchange of ibv_rc_pingpong).
//
//   integrity_peer [--server] [options]              the server (responder)
//   integrity_peer [options] --client ADDRESS        the client (requester)
//   integrity_peer [options] ADDRESS                 the client, as the pingpongs take it
//
// The client runs RC SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM and
// RDMA_READ at 0, 1, MTU-1, MTU, MTU+1, several MTUs, 64 KiB+1 and 1 MiB
// (twice each), bursts of 32 messages in flight, FETCH_AND_ADD and
// CMP_AND_SWP chains on one slot; then UC SEND and WRITE (with and without
// immediate) and UD SEND (up to the MTU). Gathers and scatters go through
// three uneven SGEs between guard bytes; patterns are seeded. The server
// checks every byte it received (guards included) and every receive
// completion (status, opcode, byte_len, imm, qp_num, src_qp, GRH); the
// client every send completion, every byte a READ brought back and every
// atomic's original value. Exit 0 only when all of it matched; the client
// ends with "integrity: N cases, N operations, N bytes, all correct".
//
// Options:
//   --port P          TCP port of the out-of-band exchange (18515)
//   --dev NAME        the RDMA device (the first one)
//   --gid-index N     the GID of the port that reaches the peer (0: softhca's
//                     first interface address; the loopback ones come last)
//   --seed N          the patterns' seed (1)
//   --max-size BYTES  leave out larger messages (1048576)
//   --max-read-size BYTES  the same for RDMA READs alone (1048576)
//   --rc-only         RC alone: UC and UD lose messages on a lossy link by design
//   --burst N         messages in flight together in the burst cases (32)
//   --only INDEX      just case INDEX of the full list (a failure names it)
//   --soak SECONDS    instead of the cases, RDMA WRITE 64 KiB+3 and READ it
//                     back for that long, checked, with no TCP traffic (a host
//                     can be killed under it: the client then names the
//                     failed completion's status and the milliseconds since
//                     its last good one)
//   --qp-timeout N    the RC QP's ack timeout exponent (14: 67 ms)
//   --retry-cnt N     the RC QP's retry count (7)
//   --rc-psn N        the RC QP's first PSN (a few hundred short of 2^24, so
//                     that PSNs wrap early in every run)
//   --op-timeout S    seconds one case's completions may take (20)
//   --timeout S       seconds the whole run may take (120), then exit 3
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#include "peer.hpp"

namespace {

void usage(FILE* to) {
  std::fprintf(to,
               "usage: integrity_peer [--server] [options]  |  integrity_peer [options] [--client] ADDRESS\n"
               "options: --port P  --dev NAME  --gid-index N  --seed N  --max-size BYTES  --rc-only\n"
               "         --max-read-size BYTES  --burst N  --only INDEX\n"
               "         --soak SECONDS  --qp-timeout N  --retry-cnt N  --rc-psn N  --op-timeout S  --timeout S\n"
               "(the header of tests/system/integrity/integrity_peer.cpp says what it checks)\n");
}

void on_alarm(int) {
  static const char text[] = "integrity: timed out (--timeout)\n";
  [[maybe_unused]] ssize_t n = ::write(STDOUT_FILENO, text, sizeof text - 1);
  ::_exit(3);
}

bool number(const char* text, unsigned long long max, unsigned long long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text, &end, 0);
  return errno == 0 && end != text && *end == '\0' && out <= max;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace integrity;
  RdmaOptions rdma;
  PeerOptions peer_options;
  std::string server_address;
  bool server_flag = false;
  unsigned long long port = 18515, timeout_s = 120;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    unsigned long long v = 0;
    auto value = [&](unsigned long long max) {
      if (!has_value || !number(argv[++i], max, v)) {
        std::fprintf(stderr, "integrity_peer: %s wants a number up to %llu\n", a.c_str(), max);
        std::exit(2);
      }
      return v;
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--server") {
      server_flag = true;
    } else if (a == "--client" && has_value) {
      server_address = argv[++i];
    } else if (a == "--port") {
      port = value(65535);
    } else if (a == "--dev" && has_value) {
      rdma.device = argv[++i];
    } else if (a == "--gid-index") {
      rdma.gid_index = static_cast<int>(value(255));
    } else if (a == "--seed") {
      peer_options.plan.seed = value(~0ULL);
    } else if (a == "--max-size") {
      peer_options.plan.max_size = static_cast<uint32_t>(value(1u << 20));
    } else if (a == "--max-read-size") {
      peer_options.plan.max_read_size = static_cast<uint32_t>(value(1u << 20));
    } else if (a == "--burst") {
      peer_options.plan.burst = std::max(static_cast<uint32_t>(value(kQueueDepth)), 1u);
    } else if (a == "--only") {
      peer_options.plan.only = static_cast<long>(value(100000));
    } else if (a == "--rc-only") {
      peer_options.plan.rc_only = true;
    } else if (a == "--soak") {
      peer_options.soak_seconds = static_cast<int>(value(3600));
    } else if (a == "--qp-timeout") {
      rdma.qp_timeout = static_cast<uint8_t>(value(31));
    } else if (a == "--rc-psn") {
      rdma.rc_psn = static_cast<long>(value(0xFFFFFF));
    } else if (a == "--retry-cnt") {
      rdma.retry_cnt = static_cast<uint8_t>(value(7));
    } else if (a == "--op-timeout") {
      peer_options.op_timeout = std::chrono::seconds(value(3600));
    } else if (a == "--timeout") {
      timeout_s = value(86400);
    } else if (a[0] != '-' && server_address.empty()) {
      server_address = a;
    } else {
      std::fprintf(stderr, "integrity_peer: unknown or incomplete argument %s\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (server_flag && !server_address.empty()) {
    std::fprintf(stderr, "integrity_peer: --server and a server address exclude each other\n");
    return 2;
  }
  const bool server = server_address.empty();
  std::signal(SIGALRM, on_alarm);
  ::alarm(static_cast<unsigned>(timeout_s));
  // Line-buffered even into a file, so that a killed run shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* role = server ? "integrity server" : "integrity";
  const auto setup_deadline = Clock::now() + std::chrono::seconds(timeout_s);
  peer_options.idle_timeout = std::chrono::seconds(timeout_s);

  auto host = Host::open(rdma, peer_options.plan.seed + (server ? 1 : 0));
  if (!host) {
    std::printf("%s: %s\n", role, host.error().c_str());
    return 1;
  }
  auto channel = server ? accept_one(static_cast<uint16_t>(port), setup_deadline)
                        : connect_to(server_address, static_cast<uint16_t>(port), setup_deadline);
  if (!channel) {
    std::printf("%s: %s\n", role, channel.error().c_str());
    return 1;
  }
  // The client speaks first; each side then knows the other's QPs and buffer.
  const Msg mine = (*host)->self().to_msg();
  std::string error = server ? "" : channel->send(mine);
  auto theirs = error.empty() ? channel->recv(setup_deadline) : std::unexpected(error);
  if (theirs && server) error = channel->send(mine);
  if (!theirs || theirs->type != MsgType::kHello || !error.empty()) {
    std::printf("%s: no exchange with the peer: %s\n", role,
                !theirs ? theirs.error().c_str() : error.empty() ? "unexpected message" : error.c_str());
    return 1;
  }
  const Endpoint peer = Endpoint::from_msg(*theirs);
  if (std::string e = (*host)->connect(peer); !e.empty()) {
    std::printf("%s: %s\n", role, e.c_str());
    return 1;
  }
  peer_options.plan.mtu = (*host)->path_mtu();
  std::printf("%s: QPs RC 0x%06x UC 0x%06x UD 0x%06x, peer's RC 0x%06x, path MTU %u\n", role, (*host)->self().rc_qpn,
              (*host)->self().uc_qpn, (*host)->self().ud_qpn, peer.rc_qpn, peer_options.plan.mtu);
  return server ? run_server(**host, *channel, peer, peer_options) : run_client(**host, *channel, peer, peer_options);
}
