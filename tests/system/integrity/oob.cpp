#include "oob.hpp"

#include <endian.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace integrity {
namespace {

constexpr size_t kFrameBytes = (1 + Msg::kWords) * 8 + Msg::kTextBytes;

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1000));
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

Channel& Channel::operator=(Channel&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Channel::send(const Msg& m) {
  uint8_t frame[kFrameBytes] = {};
  const uint64_t type = htobe64(static_cast<uint64_t>(m.type));
  std::memcpy(frame, &type, 8);
  for (int i = 0; i < Msg::kWords; ++i) {
    const uint64_t w = htobe64(m.w[i]);
    std::memcpy(frame + 8 * (i + 1), &w, 8);
  }
  std::memcpy(frame + 8 * (1 + Msg::kWords), m.text.data(), std::min(m.text.size(), Msg::kTextBytes - 1));
  size_t sent = 0;
  while (sent < kFrameBytes) {
    const ssize_t n = ::send(fd_, frame + sent, kFrameBytes - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_text("send on the TCP channel");
    sent += static_cast<size_t>(n);
  }
  return {};
}

std::expected<Msg, std::string> Channel::recv(Clock::time_point deadline) {
  uint8_t frame[kFrameBytes];
  size_t got = 0;
  while (got < kFrameBytes) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return std::unexpected(errno_text("poll on the TCP channel"));
    if (ready == 0) {
      if (Clock::now() >= deadline) return std::unexpected("no message from the peer in time");
      continue;
    }
    const ssize_t n = ::recv(fd_, frame + got, kFrameBytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(errno_text("recv on the TCP channel"));
    if (n == 0) return std::unexpected("the peer closed the TCP channel");
    got += static_cast<size_t>(n);
  }
  Msg m;
  uint64_t w;
  std::memcpy(&w, frame, 8);
  m.type = static_cast<MsgType>(be64toh(w));
  for (int i = 0; i < Msg::kWords; ++i) {
    std::memcpy(&w, frame + 8 * (i + 1), 8);
    m.w[i] = be64toh(w);
  }
  const char* text = reinterpret_cast<const char*>(frame + 8 * (1 + Msg::kWords));
  m.text.assign(text, strnlen(text, Msg::kTextBytes));
  return m;
}

std::expected<Channel, std::string> accept_one(uint16_t port, Clock::time_point deadline) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(errno_text("socket"));
  Channel listener(fd);  // closes it on every way out
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 peers too
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(port);
  addr.sin6_addr = in6addr_any;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return std::unexpected(errno_text("bind"));
  if (::listen(fd, 1) != 0) return std::unexpected(errno_text("listen"));
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_until(deadline));
    if (ready < 0 && errno != EINTR) return std::unexpected(errno_text("poll"));
    if (ready > 0) {
      const int peer = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (peer < 0) return std::unexpected(errno_text("accept"));
      ::setsockopt(peer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return Channel(peer);
    }
    if (Clock::now() >= deadline) return std::unexpected("no client connected in time");
  }
}

std::expected<Channel, std::string> connect_to(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list); rc != 0) {
    return std::unexpected(host + ": " + gai_strerror(rc));
  }
  std::string error = "no address";
  for (;;) {
    for (addrinfo* a = list; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::freeaddrinfo(list);
        return Channel(fd);
      }
      error = errno_text(("connect to " + host).c_str());
      ::close(fd);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(list);
  return std::unexpected(error);
}

}  // namespace integrity
