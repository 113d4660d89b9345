#include "cm/local_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cm/mad_codec.hpp"
#include "common/log.hpp"
#include "host/host_identity.hpp"

namespace softhca::cm {
namespace {

std::errc errc_from_errno(int err) { return static_cast<std::errc>(err); }

bool fill_sockaddr(const std::string& path, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return true;
}

void set_send_timeout(int fd) {
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

Result<std::string> endpoint_directory() { return host::host_directory(); }

LocalTransport::Conn::~Conn() {
  if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<LocalTransport>> LocalTransport::open(const std::string& path) {
  sockaddr_un addr;
  if (!fill_sockaddr(path, addr)) return fail(std::errc::filename_too_long);
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return fail(errc_from_errno(errno));
  ::unlink(path.c_str());  // a stale endpoint of a dead process that had our pid
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    SOFTHCA_ERROR("cm: cannot listen at %s: %s", path.c_str(), std::strerror(err));
    ::close(fd);
    return fail(errc_from_errno(err));
  }
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return fail(errc_from_errno(err));
  }
  return std::unique_ptr<LocalTransport>(new LocalTransport(fd, wake, path));
}

LocalTransport::~LocalTransport() {
  ::close(listen_fd_);
  ::close(wake_fd_);
  ::unlink(path_.c_str());
}

std::shared_ptr<LocalTransport::Conn> LocalTransport::find(uint32_t pid) {
  std::lock_guard g(mu_);
  for (auto& c : conns_)
    if (c->pid == pid) return c;
  return nullptr;
}

void LocalTransport::add(std::shared_ptr<Conn> conn) {
  {
    std::lock_guard g(mu_);
    conns_.push_back(std::move(conn));
  }
  wake();
}

void LocalTransport::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

Result<void> LocalTransport::send(const Peer& to, std::span<const uint8_t> bytes) {
  const uint32_t pid = to.pid;
  const std::string& path = to.path;
  std::shared_ptr<Conn> conn = find(pid);
  if (!conn) {
    if (path.empty()) return fail(std::errc::connection_refused);
    sockaddr_un addr;
    if (!fill_sockaddr(path, addr)) return fail(std::errc::filename_too_long);
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(errc_from_errno(errno));
    set_send_timeout(fd);
    int rc;
    do {
      rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      return fail(errc_from_errno(err == ENOENT ? ENOENT : err == ECONNREFUSED ? ECONNREFUSED : err));
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid() ||
        static_cast<uint32_t>(cred.pid) != pid) {
      SOFTHCA_WARN("cm: endpoint %s does not belong to process %u; ignoring it", path.c_str(), pid);
      ::close(fd);
      return fail(std::errc::connection_refused);
    }
    // Kept even if another connection to pid appeared meanwhile (the peer
    // connected to us, or — connecting to ourselves — the CM thread accepted
    // this very connection): closing ours would look like a lost peer.
    conn = std::make_shared<Conn>(fd, pid);
    add(conn);
  }
  ssize_t n;
  do {
    n = ::send(conn->fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) return fail(std::errc::connection_refused);
    return fail(errc_from_errno(err == EAGAIN ? ETIMEDOUT : err));
  }
  return {};
}

void LocalTransport::poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost) {
  std::vector<std::shared_ptr<Conn>> snapshot;
  {
    std::lock_guard g(mu_);
    snapshot = conns_;
  }
  std::vector<pollfd> fds;
  fds.reserve(snapshot.size() + 2);
  fds.push_back({wake_fd_, POLLIN, 0});
  fds.push_back({listen_fd_, POLLIN, 0});
  for (auto& c : snapshot) fds.push_back({c->fd, POLLIN, 0});
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return;

  if (fds[0].revents & POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
  }
  if (fds[1].revents & POLLIN) {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) {
        SOFTHCA_WARN("cm: refusing a connection from another user (uid %u)", cred.uid);
        ::close(fd);
        continue;
      }
      set_send_timeout(fd);
      std::lock_guard g(mu_);
      conns_.push_back(std::make_shared<Conn>(fd, static_cast<uint32_t>(cred.pid)));
    }
  }
  std::vector<uint32_t> closed_pids;
  for (std::size_t i = 0; i < snapshot.size(); ++i) {
    const short rev = fds[i + 2].revents;
    if (rev == 0) continue;
    auto& c = snapshot[i];
    bool closed = (rev & (POLLERR | POLLNVAL)) != 0;
    if (rev & (POLLIN | POLLHUP)) {
      for (;;) {
        uint8_t buf[kMadSize * 2];
        ssize_t r = ::recv(c->fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
        if (r > 0) {
          if (static_cast<std::size_t>(r) <= sizeof buf) {
            on_message(Peer{c->pid, std::string()}, std::span<const uint8_t>(buf, static_cast<std::size_t>(r)));
          } else {
            SOFTHCA_WARN("cm: dropping an oversized message (%zd bytes) from process %u", r, c->pid);
          }
          continue;
        }
        if (r == 0) closed = true;
        else if (errno == EINTR) continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) closed = true;
        break;
      }
    }
    if (!closed) continue;
    bool others = false;
    {
      std::lock_guard g(mu_);
      std::erase(conns_, c);
      for (auto& o : conns_) others = others || o->pid == c->pid;
    }
    if (!others) closed_pids.push_back(c->pid);
  }
  for (uint32_t pid : closed_pids) on_lost(Peer{pid, std::string()});
}

void LocalTransport::abandon_after_fork() {
  ::close(listen_fd_);
  ::close(wake_fd_);
  for (auto& c : conns_) {
    ::close(c->fd);
    c->fd = -1;
  }
  listen_fd_ = wake_fd_ = -1;
}

void LocalTransport::leave_at_exit() { ::unlink(path_.c_str()); }

}  // namespace softhca::cm
