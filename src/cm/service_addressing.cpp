// Addressing: bind, address resolution (unicast and multicast), route
// resolution and multicast joins. A destination on this host is resolved at
// once; one on another host once the kernel knows the link-layer address of
// the route's next hop (cm/kernel_neighbour.hpp), as the kernel's ib_addr
// resolves it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "cm/kernel_neighbour.hpp"
#include "cm/service.hpp"
#include "cm/service_internal.hpp"
#include "common/log.hpp"
#include "engine/device/device_info.hpp"

namespace softhca::cm {
namespace {

// How often a waiting resolution looks at its next hop's neighbour entry.
// The kernel looks again when a neighbour becomes valid (a netevent); user
// space has no such notice without a netlink subscription per process, and
// a look is two netlink round trips, so a few milliseconds cost little and
// add little to the time an answer takes.
constexpr std::chrono::milliseconds kNeighbourRecheck{5};

IpAddress loopback_of(uint8_t family) {
  IpAddress ip;
  ip.family = family;
  ip.addr = family == AF_INET ? engine::kLoopbackV4Gid : engine::kLoopbackV6Gid;
  return ip;
}

// Whether the kernel has any route to `dst` (no packet is sent).
bool kernel_has_route(const IpAddress& dst) {
  sockaddr_storage ss;
  IpAddress d = dst;
  d.port = 9;
  socklen_t len = to_sockaddr(d, ss);
  int fd = ::socket(dst.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
  const int err = errno;
  ::close(fd);
  return rc == 0 || (err != ENETUNREACH && err != EHOSTUNREACH);
}

// The source address the kernel would pick for `dst` (a UDP connect, nothing sent).
std::optional<IpAddress> kernel_source_for(const IpAddress& dst) {
  sockaddr_storage ss;
  IpAddress d = dst;
  d.port = 9;
  socklen_t len = to_sockaddr(d, ss);
  int fd = ::socket(dst.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::optional<IpAddress> out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0) {
    sockaddr_storage local;
    socklen_t llen = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0)
      if (auto ip = from_sockaddr(reinterpret_cast<sockaddr*>(&local), llen)) out = *ip;
  }
  ::close(fd);
  return out;
}

// An IP multicast group (224.0.0.0/4, ff00::/8), which rdma_resolve_addr accepts as a destination.
bool is_multicast(const IpAddress& ip) {
  return ip.family == AF_INET ? (ip.addr[12] & 0xF0) == 0xE0 : ip.addr[0] == 0xff;
}

}  // namespace

Result<void> Service::bind_locked(CmId* id, const IpAddress& addr) {
  if (addr.family != AF_INET && addr.family != AF_INET6) return fail(std::errc::address_family_not_supported);
  std::optional<uint32_t> idx;
  if (!addr.wildcard()) {
    idx = local_gid_index(addr, engine::device_info());
    if (!idx) return fail(std::errc::address_not_available);
  }
  auto r = table_->bind(proc_, bind_key(id->ps_, addr));
  if (!r) return fail(r.error());
  id->binding_ = r->first;
  id->src_ = addr;
  id->src_.port = r->second;
  id->bound_ = true;
  if (idx) {
    id->has_device_ = true;
    id->sgid_index_ = static_cast<uint8_t>(*idx);
    id->sgid_ = detail::gid_at(*idx);
  }
  return {};
}

Result<void> Service::bind(CmId* id, const IpAddress& addr) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  if (id->bound_ || id->addr_resolved_ || id->listening_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
  return bind_locked(id, addr);
}

Result<void> Service::resolve_addr(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst_in,
                                   int timeout_ms) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  // A resolution still under way is the kernel's ADDR_QUERY state, from
  // which rdma_resolve_addr fails with EINVAL too.
  if (id->listening_ || id->conn_.has_cm() || id->route_resolved_ || id->addr_query_)
    return fail(std::errc::invalid_argument);
  if (dst_in.family != AF_INET && dst_in.family != AF_INET6) return fail(std::errc::address_family_not_supported);
  IpAddress dst = dst_in;
  if (dst.wildcard()) {
    const uint16_t port = dst.port;
    dst = loopback_of(dst.family);  // the kernel resolves the any-address to the host itself
    dst.port = port;
  }
  const auto& dev = engine::device_info();
  if (src && !src->wildcard() && !local_gid_index(*src, dev)) return fail(std::errc::address_not_available);
  if (is_multicast(dst)) return resolve_multicast_locked(id, src, dst);
  const auto dst_idx = local_gid_index(dst, dev);
  if (!dst_idx) return resolve_other_host_locked(id, src, dst, timeout_ms);
  // A local destination is reached from itself (through lo).
  const auto s = source_locked(id, src, [&] { return std::optional<IpAddress>(dst); });
  if (auto r = take_source_locked(id, *s); !r) return r;
  resolved_locked(id, dst, local_gid_index(id->src_, dev).value_or(*dst_idx), detail::gid_at(*dst_idx));
  return {};
}

std::optional<IpAddress> Service::source_locked(const CmId* id, const std::optional<IpAddress>& src,
                                                const std::function<std::optional<IpAddress>()>& otherwise) {
  if (src && !src->wildcard()) return *src;
  if (id->bound_ && !id->src_.wildcard()) return id->src_;
  auto s = otherwise();
  if (s) s->port = id->bound_ ? id->src_.port : (src ? src->port : 0);
  return s;
}

Result<void> Service::take_source_locked(CmId* id, const IpAddress& s) {
  if (!id->bound_) return bind_locked(id, s);
  if (id->src_.wildcard()) {
    const uint16_t port = id->src_.port;
    id->src_ = s;
    id->src_.port = port;
  }
  return {};
}

void Service::resolved_locked(CmId* id, const IpAddress& dst, uint32_t sgid_index, const Gid& dgid) {
  id->dst_ = dst;
  id->has_device_ = true;
  id->sgid_index_ = static_cast<uint8_t>(sgid_index);
  id->sgid_ = detail::gid_at(sgid_index);
  id->dgid_ = dgid;
  id->addr_resolved_ = true;
  EventOut ev;
  ev.type = CmEventType::kAddrResolved;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
}

void Service::set_node_source(std::function<engine::Node*()> source) {
  std::lock_guard g(mu_);
  node_source_ = std::move(source);
}

Result<void> Service::reach_other_hosts_locked() {
  engine::Node* node = node_source_ ? node_source_() : nullptr;
  if (node == nullptr) return fail(std::errc::not_supported);
  return transport_->reach_other_hosts(*node);
}

Result<void> Service::resolve_other_host_locked(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst,
                                                int timeout_ms) {
  // Another host, over the udp link: from the given or bound source, else
  // the one the kernel's route picks, which must be one of ours. As in the
  // kernel, no route at all is ENETUNREACH at once; a route is not enough
  // though: the neighbour entry of its next hop (the gateway, or the host
  // itself when on-link) must be valid, and until it is the CM thread looks
  // again, nudging the kernel to ask, until timeout_ms has passed
  // (ADDR_ERROR, -ETIMEDOUT), as the kernel's addr_resolve retries do. The
  // first look is the CM thread's too: no netlink under mu_, and the event
  // comes from there as the kernel's comes from its work queue.
  if (!kernel_has_route(dst)) return fail(std::errc::network_unreachable);
  const auto s = source_locked(id, src, [&] { return kernel_source_for(dst); });
  if (!s) return fail(std::errc::network_unreachable);
  const auto sidx = local_gid_index(*s, engine::device_info());
  if (!sidx) return fail(std::errc::address_not_available);
  if (auto r = reach_other_hosts_locked(); !r) {
    SOFTHCA_WARN("cm: cannot reach other hosts: %s", std::make_error_code(r.error()).message().c_str());
    id->dst_ = dst;
    EventOut ev;
    ev.type = CmEventType::kAddrError;
    ev.status = -EHOSTUNREACH;
    push_event_locked(id->channel_, Event{id, nullptr, id, ev});
    return {};
  }
  if (auto r = take_source_locked(id, *s); !r) return r;
  id->dst_ = dst;
  id->addr_resolved_ = false;  // resolving again: no route on the old address meanwhile
  const auto now = std::chrono::steady_clock::now();
  // rdma_resolve_addr's int reaches the kernel as an unsigned 32-bit count:
  // a negative timeout is a very long one there, and here.
  const auto timeout = std::chrono::milliseconds(static_cast<uint32_t>(timeout_ms));
  id->addr_query_ = CmId::AddrQuery{dst, *sidx, now + timeout, ++id->addr_generation_};
  arm_addr_check_locked(id, now);
  return {};
}

void Service::arm_addr_check_locked(CmId* id, std::chrono::steady_clock::time_point when) {
  // The CM thread sleeps until the earliest deadline; it must hear of an earlier one.
  const bool earliest = addr_checks_.empty() || when < addr_checks_.begin()->first;
  id->addr_timer_ = addr_checks_.emplace(when, id->comm_id_);
  if (earliest) transport_->wake();
}

void Service::cancel_addr_query_locked(CmId* id) {
  if (id->addr_timer_) addr_checks_.erase(*id->addr_timer_);
  id->addr_timer_.reset();
  id->addr_query_.reset();
}

void Service::check_neighbours() {
  struct Look {
    uint32_t comm = 0;
    uint32_t generation = 0;
    IpAddress dst;
    IpAddress src;
    neighbour::Verdict verdict = neighbour::Verdict::kIdle;
  };
  std::vector<Look> looks;
  {
    std::lock_guard g(mu_);
    const auto now = std::chrono::steady_clock::now();
    while (const auto due = pop_due_locked(addr_checks_, now)) {
      const auto [comm, id] = *due;
      if (id == nullptr) continue;
      id->addr_timer_.reset();
      if (id->destroying_ || !id->addr_query_) continue;
      const CmId::AddrQuery& q = *id->addr_query_;
      looks.push_back({comm, q.generation, q.dst, id->src_, neighbour::Verdict::kIdle});
    }
  }
  if (looks.empty()) return;
  // Without mu_: an id may be destroyed or resolve again meanwhile, which
  // the comm ID and generation below tell.
  for (Look& look : looks) {
    look.verdict = next_hop_state(look.dst);
    // Nothing asks for an absent or failed entry until a packet goes that
    // way (the kernel's neigh_event_send); INCOMPLETE is being asked already.
    if (look.verdict == neighbour::Verdict::kIdle) nudge_neighbour(look.dst, look.src);
  }
  std::lock_guard g(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (const Look& look : looks) {
    auto it = ids_.find(look.comm);
    if (it == ids_.end()) continue;
    CmId* id = it->second;
    if (id->destroying_ || !id->addr_query_ || id->addr_query_->generation != look.generation) continue;
    const CmId::AddrQuery q = *id->addr_query_;
    if (look.verdict == neighbour::Verdict::kValid) {
      SOFTHCA_DEBUG("cm: id %u: %s resolved (its next hop has a link-layer address)", look.comm,
                    to_string(q.dst).c_str());
      id->addr_query_.reset();
      id->dst_on_other_host_ = true;
      resolved_locked(id, q.dst, q.sgid_index, q.dst.addr);
    } else if (now >= q.deadline) {
      id->addr_query_.reset();
      SOFTHCA_DEBUG("cm: id %u: no link-layer address for the next hop towards %s in time", look.comm,
                    to_string(q.dst).c_str());
      EventOut ev;
      ev.type = CmEventType::kAddrError;
      ev.status = -ETIMEDOUT;
      push_event_locked(id->channel_, Event{id, nullptr, id, ev});
    } else {
      arm_addr_check_locked(id, std::min(now + kNeighbourRecheck, q.deadline));
    }
  }
}

Result<void> Service::resolve_multicast_locked(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst) {
  // A group is resolved to the local address the datagrams leave from: the
  // given or bound source, else the one the kernel's route picks (mckey
  // without -b), which must be one of ours; as in the kernel, no route at all
  // is ENETUNREACH. The group itself is the destination GID.
  const auto s = source_locked(id, src, [&] { return kernel_source_for(dst); });
  if (!s) return fail(std::errc::network_unreachable);
  const auto sidx = local_gid_index(*s, engine::device_info());
  if (!sidx) return fail(std::errc::address_not_available);
  if (auto r = take_source_locked(id, *s); !r) return r;
  resolved_locked(id, dst, *sidx, dst.addr);
  return {};
}

Result<void> Service::resolve_route(CmId* id, int /*timeout_ms*/) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  if (!id->addr_resolved_ || id->route_resolved_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
  id->route_resolved_ = true;
  id->traffic_class_ = id->tos_;
  EventOut ev;
  ev.type = CmEventType::kRouteResolved;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
  return {};
}

Result<void> Service::join_multicast(CmId* id, const Gid& mgid, void* context) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  // The kernel's rdma_join_multicast wants an id bound to a device (a local
  // address bound, or an address resolved). The event comes at once: no
  // subnet manager to ask on RoCE; the group's IP address is joined on the
  // network when the event is handed out and the id's QP attaches
  // (abi/rdmacm/multicast.cpp).
  if (id->qp_type_ != IBV_QPT_UD || !id->has_device_) return fail(std::errc::invalid_argument);
  EventOut ev;
  ev.type = CmEventType::kMulticastJoin;
  ev.qkey = detail::kUdpQkey;
  ev.mgid = mgid;
  ev.mc_context = context;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
  return {};
}

}  // namespace softhca::cm
