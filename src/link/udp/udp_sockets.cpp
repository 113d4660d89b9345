#include "link/udp/udp_sockets.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"

namespace softhca::udp {
namespace {

constexpr int kBufferBytes = 8 << 20;  // a window of packets in each direction

void set_int(int fd, int level, int name, int value) { ::setsockopt(fd, level, name, &value, sizeof value); }

// Socket buffers that hold a window of packets: net.core.rmem_max (often
// 208 KiB) would drop most of a burst. SO_*BUFFORCE passes the limit where
// we may (CAP_NET_ADMIN); elsewhere the kernel's maximum is what we get.
void set_buffers(int fd) {
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &kBufferBytes, sizeof kBufferBytes) != 0)
    set_int(fd, SOL_SOCKET, SO_RCVBUF, kBufferBytes);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &kBufferBytes, sizeof kBufferBytes) != 0)
    set_int(fd, SOL_SOCKET, SO_SNDBUF, kBufferBytes);
}

int bind_v4(uint16_t port, bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (reuse) set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1);
  set_buffers(fd);
  set_int(fd, IPPROTO_IP, IP_PKTINFO, 1);
  // DF, and with it IP ID 0 from an unconnected socket: the header image the
  // ICRC covers (wire/ip_udp.hpp).
  set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int bind_v6(uint16_t port, bool reuse) {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
  if (reuse) set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1);
  set_buffers(fd);
  set_int(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1);
  set_int(fd, IPPROTO_IPV6, IPV6_DONTFRAG, 1);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  a.sin6_addr = in6addr_any;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
}

}  // namespace

Result<std::unique_ptr<Sockets>> Sockets::open() {
  std::unique_ptr<Sockets> s(new Sockets());
  s->recv4_ = bind_v4(wire::kRoceV2Port, true);
  s->recv6_ = bind_v6(wire::kRoceV2Port, true);
  if (s->recv4_ < 0 && s->recv6_ < 0) {
    const int err = errno;
    SOFTHCA_WARN("udp link: cannot bind UDP port %u: %s; peers on other hosts cannot reach this process",
                 wire::kRoceV2Port, std::strerror(err));
    return fail(std::errc(err));
  }
  s->send4_ = bind_v4(0, false);
  s->send6_ = bind_v6(0, false);
  s->port4_ = local_port(s->send4_);
  s->port6_ = local_port(s->send6_);
  return s;
}

Sockets::~Sockets() {
  for (int fd : {recv4_, recv6_, send4_, send6_})
    if (fd >= 0) ::close(fd);
}

Result<void> Sockets::send(const wire::Gid& src, const wire::Gid& dst, uint8_t traffic_class, uint8_t hop_limit,
                           std::span<const uint8_t> payload) {
  iovec iov{const_cast<uint8_t*>(payload.data()), payload.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) * 2] = {};
  msg.msg_control = control;
  const int hops = hop_limit ? hop_limit : 64;
  const int tclass = traffic_class;
  int fd = -1;
  if (wire::is_ipv4_mapped(dst)) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(wire::kRoceV2Port);
    std::memcpy(&to.sin_addr, dst.data() + 12, 4);
    msg.msg_name = &to;
    msg.msg_namelen = sizeof to;
    msg.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(int)) * 2;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
    in_pktinfo info{};
    std::memcpy(&info.ipi_spec_dst, src.data() + 12, 4);
    std::memcpy(CMSG_DATA(c), &info, sizeof info);
    c = CMSG_NXTHDR(&msg, c);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TTL;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &hops, sizeof hops);
    c = CMSG_NXTHDR(&msg, c);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &tclass, sizeof tclass);
    fd = send4_;
    if (fd < 0) return fail(std::errc::address_family_not_supported);
    if (::sendmsg(fd, &msg, 0) < 0) return fail(std::errc(errno));
    return {};
  }
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_port = htons(wire::kRoceV2Port);
  std::memcpy(&to.sin6_addr, dst.data(), 16);
  msg.msg_name = &to;
  msg.msg_namelen = sizeof to;
  msg.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) * 2;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = IPPROTO_IPV6;
  c->cmsg_type = IPV6_PKTINFO;
  c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
  in6_pktinfo info{};
  std::memcpy(&info.ipi6_addr, src.data(), 16);
  std::memcpy(CMSG_DATA(c), &info, sizeof info);
  c = CMSG_NXTHDR(&msg, c);
  c->cmsg_level = IPPROTO_IPV6;
  c->cmsg_type = IPV6_HOPLIMIT;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &hops, sizeof hops);
  c = CMSG_NXTHDR(&msg, c);
  c->cmsg_level = IPPROTO_IPV6;
  c->cmsg_type = IPV6_TCLASS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &tclass, sizeof tclass);
  fd = send6_;
  if (fd < 0) return fail(std::errc::address_family_not_supported);
  if (::sendmsg(fd, &msg, 0) < 0) return fail(std::errc(errno));
  return {};
}

bool Sockets::receive(int fd, std::span<uint8_t> buffer, Received& out) {
  sockaddr_storage from{};
  iovec iov{buffer.data(), buffer.size()};
  alignas(cmsghdr) unsigned char control[256];
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = sizeof from;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
  if (n < 0) return false;
  out = Received{};
  out.length = static_cast<size_t>(n);
  if (msg.msg_flags & MSG_TRUNC) out.length = 0;  // larger than any packet: dropped as malformed
  if (from.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&from);
    out.src[10] = out.src[11] = 0xFF;
    std::memcpy(out.src.data() + 12, &a->sin_addr, 4);
    out.src_port = ntohs(a->sin_port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&from);
    std::memcpy(out.src.data(), &a->sin6_addr, 16);
    out.src_port = ntohs(a->sin6_port);
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      out.dst[10] = out.dst[11] = 0xFF;
      std::memcpy(out.dst.data() + 12, &info.ipi_addr, 4);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
      in6_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      std::memcpy(out.dst.data(), &info.ipi6_addr, 16);
    }
  }
  return true;
}

}  // namespace softhca::udp
