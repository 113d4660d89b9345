// Helpers shared by the rdma_cm API tests: loopback addresses, waiting for
// events with a time limit, and cm_peer, a passive peer in a process of its
// own that a test can stop, continue and kill.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace cm_test {

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sin;
}

inline sockaddr* sa(sockaddr_in& sin) { return reinterpret_cast<sockaddr*>(&sin); }

// The next event within timeout_ms, or nullptr.
inline rdma_cm_event* wait_event(rdma_event_channel* ch, int timeout_ms = 5000) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return nullptr;
  return ev;
}

// Expects an event of `type` and returns it (unacknowledged).
inline rdma_cm_event* expect_event(rdma_event_channel* ch, rdma_cm_event_type type, int timeout_ms = 5000) {
  rdma_cm_event* ev = wait_event(ch, timeout_ms);
  EXPECT_NE(ev, nullptr) << "no " << rdma_event_str(type);
  if (ev == nullptr) return nullptr;
  EXPECT_EQ(ev->event, type) << "got " << rdma_event_str(ev->event) << " status " << ev->status;
  return ev;
}

// An active id on `ch` resolved to 127.0.0.1:port (ADDR_RESOLVED and
// ROUTE_RESOLVED consumed).
inline rdma_cm_id* resolved_id(rdma_event_channel* ch, uint16_t port) {
  rdma_cm_id* id = nullptr;
  EXPECT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = loopback(port);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  rdma_cm_event* ev = expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (ev) rdma_ack_cm_event(ev);
  EXPECT_NE(id->verbs, nullptr);
  EXPECT_NE(id->pd, nullptr);
  EXPECT_EQ(id->port_num, 1);
  EXPECT_EQ(rdma_resolve_route(id, 2000), 0);
  ev = expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  if (ev) rdma_ack_cm_event(ev);
  EXPECT_EQ(id->route.num_paths, 1);
  return id;
}

struct Peer {
  pid_t pid = -1;
  FILE* out = nullptr;

  // cm_peer MODE PORT [EXTRA] (see cm_peer.cpp).
  bool start(const char* mode, uint16_t port, const char* extra = nullptr) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      const std::string p = std::to_string(port);
      execl(SOFTHCA_CM_PEER, SOFTHCA_CM_PEER, mode, p.c_str(), extra, static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    out = fdopen(fds[0], "r");
    return pid > 0 && out != nullptr;
  }
  // The next line the peer prints (within timeout_ms).
  std::string line(int timeout_ms = 10000) {
    pollfd p{fileno(out), POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return "(timeout)";
    char buf[128] = {};
    if (fgets(buf, sizeof buf, out) == nullptr) return "(eof)";
    return std::string(buf);
  }
  // SIGSTOP / SIGCONT: a peer whose process (and so its CM) does not run.
  void stop() {
    if (pid > 0) {
      kill(pid, SIGSTOP);
      int status = 0;
      waitpid(pid, &status, WUNTRACED);  // returns once it is stopped
    }
  }
  void resume() {
    if (pid > 0) kill(pid, SIGCONT);
  }
  void kill9() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~Peer() {
    kill9();
    if (out != nullptr) fclose(out);
  }
};

inline uint16_t test_port(int offset) { return static_cast<uint16_t>(20000 + (getpid() * 4 + offset) % 10000); }

}  // namespace cm_test
