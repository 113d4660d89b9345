// cm_probe: rdma_cm situations between two hosts that the Debian programs
// do not report, written against the C API only (librdmacm.so.1, ours by
// the test's LD_LIBRARY_PATH). Every line goes out at once (line-buffered),
// so a harness can act on it.
//
//   cm_probe resolve-pending ADDR
//     ADDR is an address nobody answers for (on-link, so only the neighbour
//     table stands in the way). While rdma_resolve_addr waits, resolving
//     again and resolving the route fail with EINVAL; destroying the id
//     then yields no event; a second id's short resolution ends in
//     ADDR_ERROR -ETIMEDOUT, after which resolving again is allowed (and
//     destroyed mid-way too). Exit 0 when all of that held.
//
//   cm_probe killed-when-connected ADDR PORT
//     A child process connects to a listener at ADDR:PORT (no QP) and, once
//     connected, kills itself with SIGKILL: nothing of it runs to disconnect.
//     Exit 0 when the child died so.
//
//   cm_probe killed-before-rtu ADDR PORT
//     The same, killed once the REP came, before its RTU: the kernel's CM
//     sends a REJ for such a process.
//
//   cm_probe await-disconnect PORT SECS   (await-reject PORT SECS)
//     Listens on 0.0.0.0:PORT, accepts one connection (no QP), prints every
//     event until DISCONNECTED ("DISCONNECTED, status N, T ms after the
//     accept") and exits 0; exit 1 when none came within SECS seconds.
//     await-reject waits for REJECTED instead (the connection never
//     established).
//
//   cm_probe disconnect-after-cut ADDR PORT
//     Connects to a listener at ADDR:PORT (no QP: the connection only, so
//     CONNECT_RESPONSE, then rdma_establish), prints "established", waits
//     (30 s at most) for the interface it reaches ADDR through to lose its
//     carrier (the peer's end of the veth went down), then calls
//     rdma_disconnect: nobody answers its DREQ, and the event is printed as
//     "DISCONNECTED, status N". Exit 1 when N is not 0 (the disconnect
//     failed), 2 on anything unexpected.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++failures;
}

// The next event of `ch` within `ms`, or nullptr.
rdma_cm_event* next_event(rdma_event_channel* ch, int ms) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

bool parse(const char* host, const char* port, sockaddr_storage& out) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (getaddrinfo(host, port, &hints, &res) != 0) return false;
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return true;
}

int resolve_pending(const char* host) {
  sockaddr_storage dst;
  if (!parse(host, "7174", dst)) return 2;
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return 2;

  check(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 10'000) == 0, "a resolution begins");
  errno = 0;
  check(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 10'000) == -1 && errno == EINVAL,
        "resolving again while it waits is EINVAL");
  errno = 0;
  check(rdma_resolve_route(id, 1000) == -1 && errno == EINVAL, "resolving the route while it waits is EINVAL");
  check(rdma_destroy_id(id) == 0, "destroying the waiting id");
  check(next_event(ch, 300) == nullptr, "no event after the destroy");

  rdma_cm_id* second = nullptr;
  if (rdma_create_id(ch, &second, nullptr, RDMA_PS_TCP) != 0) return 2;
  const auto began = std::chrono::steady_clock::now();
  check(rdma_resolve_addr(second, nullptr, reinterpret_cast<sockaddr*>(&dst), 300) == 0, "a short resolution begins");
  rdma_cm_event* ev = next_event(ch, 5000);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count();
  check(ev != nullptr && ev->event == RDMA_CM_EVENT_ADDR_ERROR && ev->status == -ETIMEDOUT,
        "it ends in ADDR_ERROR -ETIMEDOUT");
  check(took >= 300 && took < 2000, "after the timeout given, not long after");
  std::printf("the short resolution took %lld ms\n", static_cast<long long>(took));
  if (ev != nullptr) rdma_ack_cm_event(ev);
  check(rdma_resolve_addr(second, nullptr, reinterpret_cast<sockaddr*>(&dst), 10'000) == 0,
        "resolving again after ADDR_ERROR is allowed");
  check(rdma_destroy_id(second) == 0, "destroying it mid-way");
  check(next_event(ch, 300) == nullptr, "no event after that destroy either");
  rdma_destroy_event_channel(ch);
  std::printf("resolve-pending: %s\n", failures == 0 ? "all as expected" : "FAILED");
  return failures == 0 ? 0 : 2;
}

// Whether the interface holding `local` has a carrier (IFF_RUNNING).
bool carrier_of(const sockaddr* local) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return true;
  bool running = true;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local->sa_family) continue;
    const bool same = local->sa_family == AF_INET
                          ? reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
                                reinterpret_cast<const sockaddr_in*>(local)->sin_addr.s_addr
                          : std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                                        &reinterpret_cast<const sockaddr_in6*>(local)->sin6_addr, 16) == 0;
    if (same) running = (i->ifa_flags & IFF_RUNNING) != 0;
  }
  freeifaddrs(all);
  return running;
}

// Waits for the next event and requires it to be `want`.
bool expect(rdma_event_channel* ch, rdma_cm_event_type want) {
  rdma_cm_event* ev = next_event(ch, 10'000);
  if (ev == nullptr || ev->event != want) {
    std::printf("expected %s, got %s\n", rdma_event_str(want), ev ? rdma_event_str(ev->event) : "nothing");
    if (ev != nullptr) rdma_ack_cm_event(ev);
    return false;
  }
  rdma_ack_cm_event(ev);
  return true;
}

// Connects `id` (on `ch`) to a listener at host:port without a QP (only the
// connection is under test). false on anything unexpected.
bool connect_without_qp(const char* host, const char* port, rdma_event_channel* ch, rdma_cm_id* id,
                        bool establish = true) {
  sockaddr_storage dst;
  if (!parse(host, port, dst)) return false;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0 ||
      !expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED))
    return false;
  if (rdma_resolve_route(id, 2000) != 0 || !expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)) return false;
  rdma_conn_param param{};
  param.qp_num = 0x123;
  param.retry_count = 7;
  // Without a QP the REP comes as CONNECT_RESPONSE, and rdma_establish
  // sends the RTU (no event follows on this side).
  if (rdma_connect(id, &param) != 0 || !expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE)) return false;
  if (!establish) return true;
  if (rdma_establish(id) != 0) {
    std::printf("rdma_establish: %s\n", std::strerror(errno));
    return false;
  }
  return true;
}

// A child process connects and is killed (SIGKILL) once connected (or,
// `before_rtu`, once the REP came and before it sends the RTU): nothing of
// it runs to disconnect. Exit 0 when the child died of that signal.
int killed_when_connected(const char* host, const char* port, bool before_rtu) {
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    if (ch == nullptr || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) _exit(2);
    if (before_rtu) {
      if (!connect_without_qp(host, port, ch, id, /*establish=*/false)) _exit(2);
      std::printf("the REP came; the connecting process kills itself before its RTU\n");
      std::fflush(stdout);
      raise(SIGKILL);
      _exit(3);
    }
    if (!connect_without_qp(host, port, ch, id)) _exit(2);
    std::printf("established; the connected process kills itself\n");
    raise(SIGKILL);
    _exit(3);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return 2;
  const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  std::printf("the connected process %s\n", killed ? "was killed (SIGKILL)" : "did not die as planned");
  return killed ? 0 : 2;
}

// Listens on PORT (any IPv4 address), accepts one connection without a QP,
// and waits up to SECS seconds for its DISCONNECTED (or `want`). Exit 0
// when it came.
int await_disconnect(const char* port, const char* secs, rdma_cm_event_type want) {
  sockaddr_storage any;
  if (!parse("0.0.0.0", port, any)) return 2;
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* listener = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP) != 0) return 2;
  if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&any)) != 0 || rdma_listen(listener, 1) != 0) {
    std::printf("cannot listen: %s\n", std::strerror(errno));
    return 2;
  }
  std::printf("await-disconnect: listening\n");
  rdma_cm_event* ev = next_event(ch, 30'000);
  if (ev == nullptr || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    std::printf("expected a connection request, got %s\n", ev ? rdma_event_str(ev->event) : "nothing");
    return 2;
  }
  rdma_cm_id* conn = ev->id;
  rdma_ack_cm_event(ev);
  rdma_conn_param param{};
  param.qp_num = 0x456;
  if (rdma_accept(conn, &param) != 0) {
    std::printf("rdma_accept: %s\n", std::strerror(errno));
    return 2;
  }
  const auto began = std::chrono::steady_clock::now();
  const auto limit = began + std::chrono::seconds(std::atoi(secs));
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - std::chrono::steady_clock::now());
    if (left.count() <= 0 || (ev = next_event(ch, static_cast<int>(left.count()))) == nullptr) {
      std::printf("no %s within %s s\n", rdma_event_str(want), secs);
      return 1;
    }
    const rdma_cm_event_type type = ev->event;
    const int status = ev->status;
    rdma_ack_cm_event(ev);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count();
    std::printf("%s, status %d, %lld ms after the accept\n", rdma_event_str(type), status, static_cast<long long>(ms));
    if (type == want) break;
    if (type != RDMA_CM_EVENT_ESTABLISHED) return 2;
  }
  rdma_destroy_id(conn);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ch);
  return 0;
}

int disconnect_after_cut(const char* host, const char* port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  if (!connect_without_qp(host, port, ch, id)) return 2;
  std::printf("established\n");

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (carrier_of(rdma_get_local_addr(id))) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("the link never went down\n");
      return 2;
    }
    poll(nullptr, 0, 10);
  }
  std::printf("the link is down; disconnecting\n");
  if (rdma_disconnect(id) != 0) {
    std::printf("rdma_disconnect: %s\n", std::strerror(errno));
    return 2;
  }
  rdma_cm_event* ev = next_event(ch, 30'000);
  if (ev == nullptr) {
    std::printf("no event after rdma_disconnect\n");
    return 2;
  }
  const int status = ev->status;
  std::printf("%s, status %d\n", rdma_event_str(ev->event), status);
  const bool disconnected = ev->event == RDMA_CM_EVENT_DISCONNECTED;
  rdma_ack_cm_event(ev);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  if (!disconnected) return 2;
  return status != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "resolve-pending" && argc == 3) return resolve_pending(argv[2]);
  if (mode == "disconnect-after-cut" && argc == 4) return disconnect_after_cut(argv[2], argv[3]);
  if (mode == "killed-when-connected" && argc == 4) return killed_when_connected(argv[2], argv[3], false);
  if (mode == "killed-before-rtu" && argc == 4) return killed_when_connected(argv[2], argv[3], true);
  if (mode == "await-disconnect" && argc == 4) return await_disconnect(argv[2], argv[3], RDMA_CM_EVENT_DISCONNECTED);
  if (mode == "await-reject" && argc == 4) return await_disconnect(argv[2], argv[3], RDMA_CM_EVENT_REJECTED);
  std::fprintf(stderr,
               "usage: cm_probe resolve-pending ADDR | disconnect-after-cut ADDR PORT |\n"
               "                killed-when-connected ADDR PORT | killed-before-rtu ADDR PORT |\n"
               "                await-disconnect PORT SECS | await-reject PORT SECS\n");
  return 2;
}
