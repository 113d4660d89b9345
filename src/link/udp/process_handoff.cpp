// Packets between the softhca processes of one host: see process_handoff.hpp.
#include "link/udp/process_handoff.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "wire/packet.hpp"

namespace softhca::udp {
namespace {

// What precedes a handed packet: what the owner needs to check its ICRC.
struct Header {
  wire::Gid src;
  wire::Gid dst;
  uint16_t src_port;
  uint16_t pad[3];
};

}  // namespace

ProcessHandoff::~ProcessHandoff() {
  for (int fd : conns_) ::close(fd);
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(path(pid_).c_str());
  }
  for (auto& [pid, peer] : peers_) ::close(peer.fd);
}

std::string ProcessHandoff::path(uint32_t pid) const { return host_dir_ + "/udp-" + std::to_string(pid) + ".sock"; }

bool ProcessHandoff::listen(const std::string& host_dir, uint32_t pid) {
  host_dir_ = host_dir;
  pid_ = pid;
  const std::string own = path(pid);
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (listen_fd_ >= 0 && own.size() < sizeof a.sun_path) {
    std::memcpy(a.sun_path, own.c_str(), own.size() + 1);
    ::unlink(own.c_str());  // a dead process's, whose pid we now have
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 128) != 0) {
      ::close(listen_fd_);
      listen_fd_ = -1;
    }
  }
  if (listen_fd_ < 0) {
    SOFTHCA_WARN("udp link: no hand-off socket in %s: packets other processes receive for this one are lost",
                 host_dir_.c_str());
    return false;
  }
  return true;
}

void ProcessHandoff::add_to(std::vector<pollfd>& fds) {
  fds.push_back({listen_fd_, POLLIN, 0});
  std::lock_guard guard(conns_mutex_);
  for (int fd : conns_) fds.push_back({fd, POLLIN, 0});
}

void ProcessHandoff::receive(const Handler& handler) {
  if (listen_fd_ < 0) return;
  // Processes that start handing us packets.
  for (;;) {
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) break;
    std::lock_guard guard(conns_mutex_);
    conns_.push_back(conn);
  }
  std::vector<int> conns;
  {
    std::lock_guard guard(conns_mutex_);
    conns = conns_;
  }
  uint8_t buffer[sizeof(Header) + wire::kMaxPayload + 256];
  for (const int conn : conns) {
    bool gone = false;
    for (int i = 0; i < 256; ++i) {
      const ssize_t n = ::recv(conn, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n <= 0) {
        gone = true;  // the process that handed us packets ended
        break;
      }
      if (static_cast<size_t>(n) <= sizeof(Header)) continue;
      Header h;
      std::memcpy(&h, buffer, sizeof h);
      Received from;
      from.src = h.src;
      from.dst = h.dst;
      from.src_port = h.src_port;
      from.length = static_cast<size_t>(n) - sizeof h;
      handler(from, std::span<const uint8_t>(buffer + sizeof h, from.length));
    }
    if (gone) {
      std::lock_guard guard(conns_mutex_);
      std::erase(conns_, conn);
      ::close(conn);
    }
  }
}

ProcessHandoff::Peer* ProcessHandoff::peer(uint32_t pid) {
  if (auto it = peers_.find(pid); it != peers_.end()) return &it->second;
  const std::string to = path(pid);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (to.size() >= sizeof a.sun_path) return nullptr;
  std::memcpy(a.sun_path, to.c_str(), to.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return nullptr;
  // Room for a burst or two of packets on their way to the owner.
  const int bytes = 4 << 20;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return nullptr;
  }
  Peer& p = peers_[pid];
  p.fd = fd;
  return &p;
}

ProcessHandoff::Result ProcessHandoff::send(uint32_t pid, uint32_t qpn, const Received& from,
                                            std::span<const uint8_t> bytes, const Handler& handler,
                                            const std::function<void()>& waiting) {
  if (host_dir_.empty()) return Result::kLost;
  Peer* owner = peer(pid);
  if (owner == nullptr) {
    SOFTHCA_DEBUG("udp link: cannot reach process %u to hand it a packet for qp 0x%x: %s", pid, qpn,
                  std::strerror(errno));
    return Result::kLost;
  }
  Header h{from.src, from.dst, from.src_port, {0, 0, 0}};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t*>(bytes.data()), bytes.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  const uint64_t give_up = monotonic_ns() + kPatienceNs;
  const int fd = owner->fd;
  for (;;) {
    if (::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
      owner->stalled = false;
      return Result::kHanded;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN || draining_ || owner->stalled) break;
    waiting();
    const uint64_t now = monotonic_ns();
    if (now >= give_up) {
      owner->stalled = true;
      SOFTHCA_DEBUG("udp link: process %u took no packet for %llu ms; one for qp 0x%x is lost", pid,
                    static_cast<unsigned long long>(kPatienceNs / 1'000'000), qpn);
      return Result::kLost;
    }
    std::vector<pollfd> waits{{fd, POLLOUT, 0}};
    add_to(waits);
    const timespec wait = time_until(give_up);
    if (::ppoll(waits.data(), waits.size(), &wait, nullptr) > 0) {
      bool incoming = false;
      for (size_t i = 1; i < waits.size(); ++i) incoming |= waits[i].revents != 0;
      if (incoming) {
        draining_ = true;
        receive(handler);
        draining_ = false;
        waiting();
      }
    }
  }
  SOFTHCA_DEBUG("udp link: a packet for qp 0x%x of process %u is lost: %s", qpn, pid, std::strerror(errno));
  if (errno != EAGAIN && !draining_) {
    // The owner is gone (or its socket with it): forget the connection.
    ::close(fd);
    peers_.erase(pid);
  }
  return Result::kLost;
}

}  // namespace softhca::udp
