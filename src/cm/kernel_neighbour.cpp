// The sockets behind address resolution's neighbour check: one rtnetlink
// request and reply per question, and the datagram that makes the kernel
// resolve a next hop.
#include "cm/kernel_neighbour.hpp"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <vector>

#include "common/log.hpp"

namespace softhca::cm {
namespace {

// The discard port (RFC 863). The datagram only has to leave so that the
// kernel asks for the next hop's link-layer address; whoever gets it should
// ignore it. A host that runs the discard service throws it away by
// definition, one that does not answers ICMP port unreachable, which this
// closed socket never reads. Not 4791: RoCEv2 receivers there (softhca's udp
// link, a real RoCE NIC) would take an empty datagram for a malformed packet
// and count it.
constexpr uint16_t kNudgePort = 9;

uint32_t next_seq() {
  static std::atomic<uint32_t> seq{1};
  return seq.fetch_add(1, std::memory_order_relaxed);
}

// Sends one request to the kernel and returns its answer. The kernel
// handles an rtnetlink GET in the sender's system call, so the answer is
// queued when sendto returns; the receive timeout only bounds the unexpected.
Result<std::vector<uint8_t>> ask_kernel(const std::vector<uint8_t>& request) {
  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  const timeval bound{0, 200'000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::vector<uint8_t> reply(8192);
  ssize_t n = ::sendto(fd, request.data(), request.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel);
  if (n >= 0) n = ::recv(fd, reply.data(), reply.size(), 0);
  const int err = errno;
  ::close(fd);
  if (n < 0) return fail(static_cast<std::errc>(err));
  reply.resize(static_cast<std::size_t>(n));
  return reply;
}

}  // namespace

neighbour::Verdict next_hop_state(const IpAddress& dst) {
  using neighbour::Verdict;
  const uint32_t route_seq = next_seq();
  auto route = ask_kernel(neighbour::route_request(dst, route_seq));
  if (!route) {
    SOFTHCA_DEBUG("cm: cannot ask the kernel for a route to %s: %s", to_string(dst).c_str(),
                  std::make_error_code(route.error()).message().c_str());
    return Verdict::kValid;
  }
  auto hop = neighbour::parse_route_reply(*route, route_seq, dst);
  if (!hop) {
    // The route went away since resolution began: wait for one, as the
    // kernel's retries do, until the caller's timeout.
    if (hop.error() == std::errc::network_unreachable || hop.error() == std::errc::host_unreachable)
      return Verdict::kResolving;
    return Verdict::kValid;
  }
  if (hop->local) return Verdict::kValid;
  const uint32_t neigh_seq = next_seq();
  auto entry = ask_kernel(neighbour::neighbour_request(*hop, neigh_seq));
  if (!entry) return Verdict::kValid;
  auto state = neighbour::parse_neighbour_reply(*entry, neigh_seq);
  if (!state) {
    SOFTHCA_DEBUG("cm: the kernel does not say how %s is reached (%s): taken as resolved", to_string(dst).c_str(),
                  std::make_error_code(state.error()).message().c_str());
    return Verdict::kValid;
  }
  return neighbour::judge(*state);
}

void nudge_neighbour(const IpAddress& dst, const std::optional<IpAddress>& src) {
  const int fd = ::socket(dst.family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  sockaddr_storage ss;
  if (src && !src->wildcard()) {
    IpAddress from = *src;
    from.port = 0;
    const socklen_t len = to_sockaddr(from, ss);
    ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len);  // a failure only loses the source's say in the route
  }
  IpAddress to = dst;
  to.port = kNudgePort;
  const socklen_t len = to_sockaddr(to, ss);
  ::sendto(fd, nullptr, 0, 0, reinterpret_cast<sockaddr*>(&ss), len);
  ::close(fd);
}

}  // namespace softhca::cm
