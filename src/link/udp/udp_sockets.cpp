#include "link/udp/udp_sockets.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "wire/icrc.hpp"
#include "wire/ud_grh.hpp"

namespace softhca::udp {
namespace {

constexpr int kBufferBytes = 8 << 20;  // a window of packets in each direction

void set_int(int fd, int level, int name, int value) { ::setsockopt(fd, level, name, &value, sizeof value); }

// IPV6_MULTICAST_ALL (Linux 4.20), which glibc's headers may not name yet.
#ifdef IPV6_MULTICAST_ALL
constexpr int kIpv6MulticastAll = IPV6_MULTICAST_ALL;
#else
constexpr int kIpv6MulticastAll = 29;
#endif

// Socket buffers that hold a window of packets: net.core.rmem_max (often
// 208 KiB) would drop most of a burst. SO_*BUFFORCE passes the limit where
// we may (CAP_NET_ADMIN); elsewhere the kernel's maximum is what we get.
void set_buffers(int fd) {
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &kBufferBytes, sizeof kBufferBytes) != 0)
    set_int(fd, SOL_SOCKET, SO_RCVBUF, kBufferBytes);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &kBufferBytes, sizeof kBufferBytes) != 0)
    set_int(fd, SOL_SOCKET, SO_SNDBUF, kBufferBytes);
}

// UDP_GRO on a receiving socket: a run of equal-size datagrams of one flow
// that arrives as one (a peer's GSO send that crossed a veth or loopback
// whole, or what the NIC's GRO joined) is read with one system call instead
// of being cut into datagrams by the kernel first; the reader splits it
// (Received::segment_size). Where the kernel lacks it, datagrams come one by
// one as before.
void accept_coalesced(int fd) { set_int(fd, IPPROTO_UDP, UDP_GRO, 1); }

int bind_v4(uint16_t port, bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (reuse) set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1);
  set_buffers(fd);
  set_int(fd, IPPROTO_IP, IP_PKTINFO, 1);
  // DF, and with it IP ID 0 from an unconnected socket: the header image the
  // ICRC covers (wire/ip_udp.hpp).
  set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO);
  set_int(fd, IPPROTO_IP, IP_MULTICAST_ALL, 0);
  set_int(fd, IPPROTO_IP, IP_MULTICAST_LOOP, 0);
  if (reuse) accept_coalesced(fd);
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
  set_int(fd, IPPROTO_IPV6, kIpv6MulticastAll, 0);
  set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 0);
  // RoCEv2 over IPv6 may leave the UDP checksum 0 (the ICRC protects the
  // packet): rxe and RoCE NICs do, and without this option the kernel
  // drops such datagrams (Udp6InCsumErrors) before we could see them. A
  // nonzero checksum is still verified. We send checksums ourselves: a GSO
  // send (UDP_SEGMENT) is refused on a socket with UDP_NO_CHECK6_TX, and
  // every receiver takes a valid checksum (docs/architecture.md).
  set_int(fd, IPPROTO_UDP, UDP_NO_CHECK6_RX, 1);
  // Flow label 0, as rxe sends, rather than the kernel's per-flow hash: the
  // ICRC masks it, and softhca cannot carry a QP's own label through a
  // socket without a flow-label lease per label.
  set_int(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0);
  if (reuse) accept_coalesced(fd);
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

Result<std::unique_ptr<Sockets>> Sockets::open(const SocketOptions& options) {
  std::unique_ptr<Sockets> s(new Sockets());
  s->gso_.store(options.gso, std::memory_order_relaxed);
  if (!options.receive) {
    s->send4_ = bind_v4(0, false);
    s->send6_ = bind_v6(0, false);
    if (s->send4_ < 0 && s->send6_ < 0) return fail(std::errc(errno));
    s->port4_ = local_port(s->send4_);
    s->port6_ = local_port(s->send6_);
    return s;
  }
  s->recv4_ = bind_v4(wire::kRoceV2Port, true);
  const int err4 = errno;
  s->recv6_ = bind_v6(wire::kRoceV2Port, true);
  const int err6 = errno;
  if (s->recv4_ < 0 && s->recv6_ < 0) {
    SOFTHCA_WARN("udp link: cannot bind UDP port %u: %s; peers on other hosts cannot reach this process",
                 wire::kRoceV2Port, std::strerror(err6));
    return fail(std::errc(err6));
  }
  // One family alone: say so, or its peers' packets vanish without a trace
  // here (the kernel counts them, with a zero UDP checksum as checksum errors).
  if (s->recv4_ < 0)
    SOFTHCA_WARN("udp link: cannot bind UDP port %u on IPv4: %s; IPv4 peers cannot reach this process",
                 wire::kRoceV2Port, std::strerror(err4));
  if (s->recv6_ < 0 && err6 != EAFNOSUPPORT)
    SOFTHCA_WARN("udp link: cannot bind UDP port %u on IPv6: %s; IPv6 peers cannot reach this process",
                 wire::kRoceV2Port, std::strerror(err6));
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

namespace {

// One message's sendmsg arguments: its destination and the control messages
// that state its source address, hop limit and traffic class, and for a run
// of packets the segment size (UDP_SEGMENT).
using IcrcBytes = std::array<uint8_t, wire::kIcrcSize>;

struct PreparedSend {
  union {
    sockaddr_in v4;
    sockaddr_in6 v6;
  } to;
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) * 2 +
                                         CMSG_SPACE(sizeof(uint16_t))];
};

template <typename T>
cmsghdr* put_cmsg(msghdr& msg, cmsghdr* c, int level, int type, const T& value) {
  c = c == nullptr ? CMSG_FIRSTHDR(&msg) : CMSG_NXTHDR(&msg, c);
  c->cmsg_level = level;
  c->cmsg_type = type;
  c->cmsg_len = CMSG_LEN(sizeof(T));
  std::memcpy(CMSG_DATA(c), &value, sizeof value);
  return c;
}

// Whether `b` may follow `a` in one GSO message: the same addresses and IP
// fields, since the kernel sends every segment with the first one's.
bool same_route(const OutgoingPacket& a, const OutgoingPacket& b) {
  return a.dst == b.dst && a.src == b.src && a.traffic_class == b.traffic_class && a.hop_limit == b.hop_limit &&
         a.ifindex == b.ifindex;
}

}  // namespace

size_t gso_run(std::span<const OutgoingPacket> packets, size_t most) {
  if (packets.empty()) return 0;
  const OutgoingPacket& first = packets[0];
  const size_t segment = first.bytes.size();
  // Multicast leaves by an interface of its own choosing; one at a time.
  if (first.ifindex != 0 || segment == 0) return 1;
  size_t n = 1;
  size_t total = segment;
  while (n < packets.size() && n < most && n < kGsoMaxSegments) {
    const OutgoingPacket& next = packets[n];
    if (!same_route(first, next) || next.bytes.empty() || next.bytes.size() > segment ||
        total + next.bytes.size() > kGsoMaxBytes)
      break;
    total += next.bytes.size();
    ++n;
    if (next.bytes.size() < segment) break;  // a shorter packet ends the run
  }
  return n;
}

namespace {

// Fills `msg` (pointing into `p`, `pieces` and `icrcs`) for the run
// `packets`, sent as one datagram when it holds one packet and as GSO
// segments of the first one's size otherwise; true for IPv4. `pieces` has
// room for two per packet, `icrcs` for one per packet.
//
// Each packet was encoded alone, its ICRC computed over IPv4 ID 0. In a GSO
// send the kernel gives segment i the ID i (an unconnected socket with
// IP_PMTUDISC_DO: the first gets a lone datagram's 0, inet_gso_segment
// counts up from there), and the ICRC covers the ID, so segment i's last
// four bytes go out from `icrcs`, recomputed for ID i, while the packet's
// own buffer keeps the ID-0 ICRC that a resend on its own needs.
bool prepare(std::span<const OutgoingPacket> packets, PreparedSend& p, iovec* pieces, IcrcBytes* icrcs, msghdr& msg) {
  const OutgoingPacket& packet = packets[0];
  const bool ipv4 = wire::is_ipv4_mapped(packet.dst);
  std::memset(&msg, 0, sizeof msg);
  std::memset(p.control, 0, sizeof p.control);
  size_t npieces = 0;
  for (size_t i = 0; i < packets.size(); ++i) {
    const std::span<const uint8_t> bytes = packets[i].bytes;
    uint8_t* data = const_cast<uint8_t*>(bytes.data());
    if (i == 0 || !ipv4 || bytes.size() < wire::kIcrcSize) {
      pieces[npieces++] = iovec{data, bytes.size()};
      continue;
    }
    const uint32_t icrc = wire::load_icrc(bytes.last<wire::kIcrcSize>()) ^
                          wire::icrc_ipv4_id_delta(static_cast<uint16_t>(i), bytes.size());
    wire::store_icrc(icrc, icrcs[i]);
    pieces[npieces++] = iovec{data, bytes.size() - wire::kIcrcSize};
    pieces[npieces++] = iovec{icrcs[i].data(), wire::kIcrcSize};
  }
  msg.msg_iov = pieces;
  msg.msg_iovlen = npieces;
  msg.msg_control = p.control;
  // The hop limit of a unicast packet is the route's, whatever the QP's
  // or AH's GRH says: on RoCE the kernel replaces it with the route's when
  // it resolves the destination's MAC (ib_resolve_eth_dmac, at modify_qp
  // and create_ah), for rxe and NICs alike; ibv_rc_pingpong's hop limit of
  // 1 would otherwise keep its packets from crossing a router. A multicast
  // group's packets keep the AH's. -1: the route's (RFC 3542; for IPv4 the
  // option is left out).
  const bool multicast = wire::is_multicast_gid(packet.dst.data());
  const int hops = !multicast ? -1 : packet.hop_limit ? packet.hop_limit : 64;
  const int tclass = packet.traffic_class;
  cmsghdr* c;
  bool v4;
  if (ipv4) {
    std::memset(&p.to.v4, 0, sizeof p.to.v4);
    p.to.v4.sin_family = AF_INET;
    p.to.v4.sin_port = htons(wire::kRoceV2Port);
    std::memcpy(&p.to.v4.sin_addr, packet.dst.data() + 12, 4);
    msg.msg_name = &p.to.v4;
    msg.msg_namelen = sizeof p.to.v4;
    msg.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(int)) * (hops < 0 ? 1 : 2);
    in_pktinfo info{};
    std::memcpy(&info.ipi_spec_dst, packet.src.data() + 12, 4);
    info.ipi_ifindex = static_cast<int>(packet.ifindex);
    c = put_cmsg(msg, nullptr, IPPROTO_IP, IP_PKTINFO, info);
    if (hops >= 0) c = put_cmsg(msg, c, IPPROTO_IP, IP_TTL, hops);
    c = put_cmsg(msg, c, IPPROTO_IP, IP_TOS, tclass);
    v4 = true;
  } else {
    std::memset(&p.to.v6, 0, sizeof p.to.v6);
    p.to.v6.sin6_family = AF_INET6;
    p.to.v6.sin6_port = htons(wire::kRoceV2Port);
    std::memcpy(&p.to.v6.sin6_addr, packet.dst.data(), 16);
    msg.msg_name = &p.to.v6;
    msg.msg_namelen = sizeof p.to.v6;
    msg.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) * 2;
    in6_pktinfo info{};
    std::memcpy(&info.ipi6_addr, packet.src.data(), 16);
    info.ipi6_ifindex = packet.ifindex;
    c = put_cmsg(msg, nullptr, IPPROTO_IPV6, IPV6_PKTINFO, info);
    c = put_cmsg(msg, c, IPPROTO_IPV6, IPV6_HOPLIMIT, hops);
    c = put_cmsg(msg, c, IPPROTO_IPV6, IPV6_TCLASS, tclass);
    v4 = false;
  }
  if (packets.size() > 1) {
    msg.msg_controllen += CMSG_SPACE(sizeof(uint16_t));
    put_cmsg(msg, c, IPPROTO_UDP, UDP_SEGMENT, static_cast<uint16_t>(packet.bytes.size()));
  }
  return v4;
}

}  // namespace

Result<void> Sockets::send(const wire::Gid& src, const wire::Gid& dst, uint8_t traffic_class, uint8_t hop_limit,
                           std::span<const uint8_t> payload, uint32_t ifindex) {
  const OutgoingPacket packet{src, dst, traffic_class, hop_limit, payload, ifindex};
  return send_batch(std::span<const OutgoingPacket>(&packet, 1)) == 0 ? Result<void>{}
                                                                       : fail(std::errc(errno));
}

Result<void> Sockets::membership(const wire::Gid& group, uint32_t ifindex, bool join) {
  int rc;
  if (wire::is_ipv4_mapped(group)) {
    if (recv4_ < 0) return fail(std::errc::address_family_not_supported);
    ip_mreqn request{};
    std::memcpy(&request.imr_multiaddr, group.data() + 12, 4);
    request.imr_ifindex = static_cast<int>(ifindex);
    rc = ::setsockopt(recv4_, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &request, sizeof request);
  } else {
    if (recv6_ < 0) return fail(std::errc::address_family_not_supported);
    ipv6_mreq request{};
    std::memcpy(&request.ipv6mr_multiaddr, group.data(), 16);
    request.ipv6mr_interface = ifindex;
    rc = ::setsockopt(recv6_, IPPROTO_IPV6, join ? IPV6_ADD_MEMBERSHIP : IPV6_DROP_MEMBERSHIP, &request,
                      sizeof request);
  }
  if (rc != 0) return fail(std::errc(errno));
  return {};
}

size_t Sockets::send_batch(std::span<const OutgoingPacket> packets) {
  constexpr size_t kMax = 64;  // packets per system call, their arguments on the stack
  PreparedSend prepared[kMax];
  mmsghdr messages[kMax];
  iovec pieces[2 * kMax];  // a GSO segment's ICRC is a piece of its own (prepare)
  IcrcBytes icrcs[kMax];
  size_t first[kMax + 1];  // the first packet (from `at`) of each message
  size_t refused = 0;
  size_t at = 0;
  size_t single_until = 0;  // packets before it go one per message (a refused run's)
  while (at < packets.size()) {
    // Messages of one IP version, sent with one system call: runs of
    // equal-size packets as one GSO message each, the rest one by one.
    size_t npackets = 0;
    size_t nmessages = 0;
    bool v4 = true;
    while (at + npackets < packets.size() && npackets < kMax) {
      const auto rest = packets.subspan(at + npackets);
      const bool batch = gso_.load(std::memory_order_relaxed) && at + npackets >= single_until;
      const size_t run = batch ? gso_run(rest, kMax - npackets) : 1;
      const bool this_v4 = prepare(rest.first(run), prepared[nmessages], pieces + 2 * npackets, icrcs + npackets,
                                    messages[nmessages].msg_hdr);
      messages[nmessages].msg_len = 0;
      if (nmessages == 0) v4 = this_v4;
      if (this_v4 != v4) break;
      first[nmessages++] = npackets;
      npackets += run;
    }
    first[nmessages] = npackets;
    const int fd = v4 ? send4_ : send6_;
    if (fd < 0) {
      errno = EAFNOSUPPORT;
      refused += npackets;
      at += npackets;
      continue;
    }
    size_t sent = 0;  // messages
    while (sent < nmessages) {
      const int r = ::sendmmsg(fd, messages + sent, static_cast<unsigned>(nmessages - sent), 0);
      if (r > 0) {
        sent += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      const size_t run = first[sent + 1] - first[sent];
      const bool full = errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS;
      if (run > 1 && !full) {
        // The kernel or the route cannot segment (no checksum offload,
        // UDP_SEGMENT unknown): send that run again packet by packet, and
        // never ask again.
        if (gso_.exchange(false, std::memory_order_relaxed))
          SOFTHCA_INFO("udp link: no UDP segmentation offload here (%s); packets go one by one",
                       std::strerror(errno));
        single_until = at + first[sent + 1];
        break;
      }
      // The first message of the rest was refused (a full send buffer, an
      // unreachable network): its packets are lost, as on a wire; go on
      // after it.
      refused += run;
      ++sent;
    }
    at += first[sent];
  }
  return refused;
}

namespace {

// Where a received datagram came from and was sent to, and its length.
void describe(const msghdr& msg, size_t length, Received& out) {
  out = Received{};
  out.length = length;
  if (msg.msg_flags & MSG_TRUNC) out.length = 0;  // larger than any packet: dropped as malformed
  const auto* from = static_cast<const sockaddr_storage*>(msg.msg_name);
  if (from->ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(from);
    out.src[10] = out.src[11] = 0xFF;
    std::memcpy(out.src.data() + 12, &a->sin_addr, 4);
    out.src_port = ntohs(a->sin_port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(from);
    std::memcpy(out.src.data(), &a->sin6_addr, 16);
    out.src_port = ntohs(a->sin6_port);
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      out.dst[10] = out.dst[11] = 0xFF;
      std::memcpy(out.dst.data() + 12, &info.ipi_addr, 4);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
      in6_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      std::memcpy(out.dst.data(), &info.ipi6_addr, 16);
    } else if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
      int segment = 0;
      std::memcpy(&segment, CMSG_DATA(c), sizeof segment);
      if (segment > 0 && static_cast<size_t>(segment) < out.length) out.segment_size = static_cast<size_t>(segment);
    }
  }
}

}  // namespace

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
  describe(msg, static_cast<size_t>(n), out);
  return true;
}

int Sockets::receive_batch(int fd, std::span<uint8_t> storage, size_t slot_bytes, std::span<Received> out) {
  constexpr size_t kMax = 64;
  const size_t want = std::min({out.size(), storage.size() / slot_bytes, kMax});
  if (fd < 0 || want == 0) return 0;
  mmsghdr messages[kMax];
  iovec iov[kMax];
  sockaddr_storage from[kMax];
  alignas(cmsghdr) unsigned char control[kMax][128];
  for (size_t i = 0; i < want; ++i) {
    iov[i] = iovec{storage.data() + i * slot_bytes, slot_bytes};
    msghdr& m = messages[i].msg_hdr;
    std::memset(&m, 0, sizeof m);
    m.msg_name = &from[i];
    m.msg_namelen = sizeof from[i];
    m.msg_iov = &iov[i];
    m.msg_iovlen = 1;
    m.msg_control = control[i];
    m.msg_controllen = sizeof control[i];
    messages[i].msg_len = 0;
  }
  const int n = ::recvmmsg(fd, messages, static_cast<unsigned>(want), MSG_DONTWAIT, nullptr);
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) describe(messages[i].msg_hdr, messages[i].msg_len, out[static_cast<size_t>(i)]);
  return n;
}

}  // namespace softhca::udp
