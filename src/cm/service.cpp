#include "cm/service.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <type_traits>
#include <variant>

#include "common/log.hpp"
#include "common/settings.hpp"
#include "engine/device/device_info.hpp"
#include "common/limits.hpp"
#include "host/host_registry.hpp"

namespace softhca::cm {
namespace {

constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY
constexpr int kMaxBacklog = 4096;
// How long a disconnected connection stays in timewait before TIMEWAIT_EXIT:
// about the kernel's (4.096 us << the RoCE ack timeout of ~17).
constexpr std::chrono::milliseconds kTimewait{500};

alignas(std::mutex) unsigned char g_init_mu_storage[sizeof(std::mutex)];
std::mutex* g_init_mu = new (g_init_mu_storage) std::mutex;
Service* g_service = nullptr;
pid_t g_service_pid = 0;
bool g_hooks_installed = false;

std::mt19937& rng() {
  static std::mt19937 gen{std::random_device{}()};
  return gen;
}

uint32_t random_psn() { return rng()() & 0xFFFFFF; }

Gid gid_at(uint32_t index) {
  Gid g{};
  if (const auto* e = engine::device_info().gid_at(index)) g = e->raw;
  return g;
}

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

uint64_t peer_key(uint32_t pid, uint32_t remote_comm_id) { return (uint64_t{pid} << 32) | remote_comm_id; }

// The CM timeouts this process's requests carry: rdma_cm's, unless
// SOFTHCA_CM_RESPONSE_TIMEOUT or SOFTHCA_CM_MAX_RETRIES (common/settings.hpp)
// say otherwise. Read at each request, so a test or a user with a slow peer
// can change them without restarting.
CmTimeouts request_timeouts() {
  // The table's defaults are rdma_cm's, and its ranges the REQ's fields
  // (5 bits of exponent, 4 bits of retries).
  static_assert(setting(SettingId::kCmResponseTimeout).default_value == kDefaultCmResponseTimeout &&
                setting(SettingId::kCmResponseTimeout).max == 31);
  static_assert(setting(SettingId::kCmMaxRetries).default_value == kDefaultMaxCmRetries &&
                setting(SettingId::kCmMaxRetries).max == 15);
  CmTimeouts t;
  t.response_timeout = static_cast<uint8_t>(setting_number(SettingId::kCmResponseTimeout));
  t.max_retries = static_cast<uint8_t>(setting_number(SettingId::kCmMaxRetries));
  return t;
}

// An IP multicast group (224.0.0.0/4, ff00::/8), which rdma_resolve_addr accepts as a destination.
bool is_multicast(const IpAddress& ip) {
  return ip.family == AF_INET ? (ip.addr[12] & 0xF0) == 0xE0 : ip.addr[0] == 0xff;
}

}  // namespace

void service_atfork_child() {
  // The parent's service (its thread does not exist here, its locks may be
  // held by threads that do not exist either) is abandoned; a fresh one
  // starts on first use.
  if (g_service != nullptr) g_service->transport_->abandon_after_fork();
  g_service = nullptr;
  g_service_pid = 0;
  g_init_mu = new (g_init_mu_storage) std::mutex;
}

void service_atexit() {
  if (g_service == nullptr || g_service_pid != ::getpid()) return;
  g_service->table_->unregister_process(g_service->proc_);
  ::unlink(g_service->transport_->path().c_str());
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

Result<Service*> Service::instance() {
  std::lock_guard g(*g_init_mu);
  if (g_service != nullptr) return g_service;
  auto* s = new Service;
  if (auto r = s->start(); !r) {
    delete s;
    return fail(r.error());
  }
  g_service = s;
  g_service_pid = ::getpid();
  if (!g_hooks_installed) {
    g_hooks_installed = true;
    pthread_atfork(nullptr, nullptr, service_atfork_child);
    std::atexit(service_atexit);
  }
  return s;
}

Result<void> Service::start() {
  auto table = PortTable::open();
  if (!table) return fail(table.error());
  table_ = *table;
  auto dir = endpoint_directory();
  if (!dir) return fail(dir.error());
  const uint32_t pid = static_cast<uint32_t>(::getpid());
  const std::string path = *dir + "/cm-" + std::to_string(pid) + ".sock";
  auto transport = Transport::open(path);
  if (!transport) return fail(transport.error());
  transport_ = std::move(*transport);
  auto proc = table_->register_process(pid, host::process_start_time(pid), path);
  if (!proc) return fail(proc.error());
  proc_ = *proc;
  comm_id_seed_ = rng()();

  // The CM thread takes no signals: they belong to the application's threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    std::thread([this] { run(); }).detach();
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return fail(std::errc::resource_unavailable_try_again);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  SOFTHCA_DEBUG("cm: service of process %u listens at %s", pid, path.c_str());
  return {};
}

void Service::run() {
  for (;;) {
    transport_->poll_once(
        next_timeout_ms(), [this](uint32_t pid, std::span<const uint8_t> bytes) { on_message(pid, bytes); },
        [this](uint32_t pid) { on_peer_lost(pid); });
    fire_timers();
  }
}

int Service::next_timeout_ms() {
  std::lock_guard g(mu_);
  std::optional<std::chrono::steady_clock::time_point> next;
  if (!timewait_.empty()) next = timewait_.begin()->first;
  if (!retransmit_.empty() && (!next || retransmit_.begin()->first < *next)) next = retransmit_.begin()->first;
  if (!next) return -1;
  const auto left = *next - std::chrono::steady_clock::now();
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, 60'000));
}

void Service::fire_timers() {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    const auto now = std::chrono::steady_clock::now();
    while (!timewait_.empty() && timewait_.begin()->first <= now) {
      const uint32_t comm = timewait_.begin()->second;
      timewait_.erase(timewait_.begin());
      auto it = ids_.find(comm);
      if (it == ids_.end() || it->second->destroying_ || it->second->conn_.state() != ConnState::kTimewait) continue;
      EventOut ev;
      ev.type = CmEventType::kTimewaitExit;
      push_event_locked(it->second->channel_, Event{it->second, nullptr, it->second, ev});
    }
    while (!retransmit_.empty() && retransmit_.begin()->first <= now) {
      const uint32_t comm = retransmit_.begin()->second;
      retransmit_.erase(retransmit_.begin());
      auto it = ids_.find(comm);
      if (it == ids_.end()) continue;
      CmId* id = it->second;
      id->rt_timer_.reset();
      if (id->destroying_) continue;
      Step step = id->conn_.on_timeout(id->rt_generation_);
      if (step.send)
        SOFTHCA_DEBUG("cm: id %u: no answer to %s in time, sending it again", comm, message_name(*step.send));
      apply_step_locked(id, std::move(step), out);
    }
  }
  send_all(std::move(out));
}

void Service::cancel_retransmit_timer_locked(CmId* id) {
  if (!id->rt_timer_) return;
  retransmit_.erase(*id->rt_timer_);
  id->rt_timer_.reset();
}

void Service::sync_retransmit_timer_locked(CmId* id) {
  const auto wait = id->conn_.retransmit();
  if (!wait) {
    cancel_retransmit_timer_locked(id);
    return;
  }
  if (id->rt_timer_ && id->rt_generation_ == wait->generation) return;
  cancel_retransmit_timer_locked(id);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait->timeout_ms);
  // The CM thread sleeps until the earliest deadline; it must hear of an earlier one.
  const bool earliest = retransmit_.empty() || deadline < retransmit_.begin()->first;
  id->rt_timer_ = retransmit_.emplace(deadline, id->comm_id_);
  id->rt_generation_ = wait->generation;
  if (earliest) transport_->wake();
}

uint8_t Service::max_responder_resources() { return static_cast<uint8_t>(limits::kMaxQpRdAtom); }
uint8_t Service::max_initiator_depth() { return static_cast<uint8_t>(limits::kMaxQpInitRdAtom); }

// ---- channels and events ----------------------------------------------------

Result<std::shared_ptr<Channel>> Service::create_channel() {
  auto ch = std::make_shared<Channel>();
  ch->fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (ch->fd_ < 0) return fail(static_cast<std::errc>(errno));
  return ch;
}

void Service::push_event_locked(Channel* ch, Event ev) {
  ch->queue_.push_back(ev);
  if (!ch->signaled_) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(ch->fd_, &one, sizeof one);
    ch->signaled_ = true;
  }
}

namespace {
// Makes the channel's fd unreadable once its queue is empty.
void reset_if_empty(int fd, bool& signaled, bool empty) {
  if (signaled && empty) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);  // never blocks: the count is 1
    signaled = false;
  }
}
}  // namespace

Result<Event> Service::get_event(Channel* ch, bool nonblocking) {
  for (;;) {
    {
      std::lock_guard g(mu_);
      if (!ch->queue_.empty()) {
        Event ev = ch->queue_.front();
        ch->queue_.pop_front();
        reset_if_empty(ch->fd_, ch->signaled_, ch->queue_.empty());
        ev.counted->delivered_++;
        if (ev.out.type == CmEventType::kConnectRequest) ev.counted->pending_requests_--;
        return ev;
      }
    }
    if (nonblocking) return fail(std::errc::resource_unavailable_try_again);
    pollfd p{ch->fd_, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return fail(static_cast<std::errc>(errno));
  }
}

void Service::ack_event(CmId* counted) {
  std::lock_guard g(mu_);
  counted->acked_++;
  if (counted->free_when_acked_ && counted->acked_ >= counted->delivered_) {
    delete counted;
    return;
  }
  acked_cv_.notify_all();
}

bool Service::has_queued_event(CmId* id) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return false;
  return std::any_of(id->channel_->queue_.begin(), id->channel_->queue_.end(),
                     [id](const Event& e) { return e.id == id || e.counted == id; });
}

void Service::drop_events_locked(CmId* id, std::vector<CmId*>& orphans) {
  Channel* ch = id->channel_;
  std::erase_if(ch->queue_, [&](const Event& e) {
    if (e.id != id && e.counted != id) return false;
    if (e.out.type == CmEventType::kConnectRequest && e.counted == id && e.id != id) {
      orphans.push_back(e.id);
      id->pending_requests_--;
    }
    return true;
  });
  reset_if_empty(ch->fd_, ch->signaled_, ch->queue_.empty());
}

Result<void> Service::migrate_id(CmId* id, Channel* to) {
  std::unique_lock lk(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  Channel* from = id->channel_;
  if (from == to) return {};
  std::deque<Event> moved;
  std::erase_if(from->queue_, [&](const Event& e) {
    if (e.id != id && e.counted != id) return false;
    moved.push_back(e);
    return true;
  });
  reset_if_empty(from->fd_, from->signaled_, from->queue_.empty());
  for (auto& e : moved) {
    if (e.id != id && e.id != nullptr) e.id->channel_ = to;  // an undelivered child follows its listener
    push_event_locked(to, e);
  }
  acked_cv_.wait(lk, [id] { return id->acked_ >= id->delivered_; });
  id->channel_ = to;
  return {};
}

// ---- ids ----------------------------------------------------------------------

uint32_t Service::next_comm_id_locked() {
  for (;;) {
    const uint32_t id = ++comm_id_seed_;
    if (id != 0 && !ids_.contains(id)) return id;
  }
}

uint64_t Service::next_tid_locked(uint32_t comm_id) { return (uint64_t{comm_id} << 32) | (++tid_counter_ & 0xFFFFFFFF); }

Result<CmId*> Service::create_id(Channel* channel, uint16_t ps, ibv_qp_type qp_type, void* user) {
  auto* id = new CmId;
  std::lock_guard g(mu_);
  id->channel_ = channel;
  id->ps_ = ps;
  id->qp_type_ = qp_type;
  id->user_ = user;
  id->comm_id_ = next_comm_id_locked();
  ids_[id->comm_id_] = id;
  return id;
}

void* Service::ensure_user(CmId* id, const std::function<void*()>& make) {
  std::lock_guard g(mu_);
  if (id->user_ == nullptr) id->user_ = make();
  return id->user_;
}

Result<void> Service::destroy_id(CmId* id) {
  std::vector<Outgoing> out;
  {
    std::unique_lock lk(mu_);
    if (id->orphaned_) {
      // Torn down with its channel already. librdmacm would fail here too
      // (its write to the closed channel fd); the memory is freed all the
      // same, at once or when the last event handed out is acknowledged.
      if (id->acked_ >= id->delivered_) {
        delete id;
      } else {
        id->free_when_acked_ = true;
      }
      return fail(std::errc::bad_file_descriptor);
    }
    destroy_locked(id, lk, out);
  }
  send_all(std::move(out));
  return {};
}

void Service::tear_down_locked(CmId* id, std::vector<Outgoing>& out) {
  id->destroying_ = true;
  Step step = id->conn_.on_destroy();
  if (step.send && id->peer_pid_ != 0)
    out.push_back({id->peer_pid_, id->peer_path_, 0, encode(Mad{next_tid_locked(id->comm_id_), *step.send})});
  cancel_retransmit_timer_locked(id);
  if (id->listening_) std::erase(listeners_, id);
  if (id->binding_ != 0) {
    table_->unbind(id->binding_);
    id->binding_ = 0;
  }
}

void Service::destroy_locked(CmId* id, std::unique_lock<std::mutex>& lk, std::vector<Outgoing>& out) {
  tear_down_locked(id, out);
  std::vector<CmId*> orphans;
  drop_events_locked(id, orphans);
  acked_cv_.wait(lk, [id] { return id->acked_ >= id->delivered_; });
  forget_locked(id);
  for (CmId* orphan : orphans) destroy_locked(orphan, lk, out);
  delete id;
}

void Service::close_channel(Channel* ch) {
  std::vector<Outgoing> out;
  {
    std::unique_lock lk(mu_);
    std::vector<CmId*> on_channel;
    for (auto& [comm, id] : ids_)
      if (id->channel_ == ch && !id->destroying_) on_channel.push_back(id);
    // Requests not handed out yet have no application handle: free them.
    std::vector<CmId*> undelivered;
    for (const Event& e : ch->queue_)
      if (e.out.type == CmEventType::kConnectRequest && e.id != e.counted) undelivered.push_back(e.id);
    for (CmId* id : on_channel) {
      if (std::find(undelivered.begin(), undelivered.end(), id) != undelivered.end()) continue;
      tear_down_locked(id, out);
      forget_locked(id);
      id->channel_ = nullptr;
      id->orphaned_ = true;
      id->pending_requests_ = 0;
    }
    ch->queue_.clear();
    reset_if_empty(ch->fd_, ch->signaled_, true);
    for (CmId* child : undelivered) {
      tear_down_locked(child, out);
      forget_locked(child);
      delete child;
    }
  }
  send_all(std::move(out));
}

IdInfo Service::info(CmId* id) {
  std::lock_guard g(mu_);
  IdInfo i;
  i.src = id->src_;
  i.dst = id->dst_;
  i.has_device = id->has_device_;
  i.sgid_index = id->sgid_index_;
  i.sgid = id->sgid_;
  i.dgid = id->dgid_;
  i.traffic_class = id->traffic_class_;
  i.conn_state = id->conn_.state();
  i.negotiated = id->conn_.negotiated();
  i.listening = id->listening_;
  i.route_resolved = id->route_resolved_;
  return i;
}

// ---- addressing -----------------------------------------------------------------

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
    id->sgid_ = gid_at(*idx);
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
                                   int /*timeout_ms*/) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  if (id->listening_ || id->conn_.has_cm() || id->route_resolved_) return fail(std::errc::invalid_argument);
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
  if (!dst_idx) {
    if (!kernel_has_route(dst)) return fail(std::errc::network_unreachable);
    // Not a host softhca reaches yet (same-host only until the udp link).
    id->dst_ = dst;
    EventOut ev;
    ev.type = CmEventType::kAddrError;
    ev.status = -EHOSTUNREACH;
    push_event_locked(id->channel_, Event{id, nullptr, id, ev});
    return {};
  }
  IpAddress s;
  if (src && !src->wildcard()) {
    s = *src;
  } else if (id->bound_ && !id->src_.wildcard()) {
    s = id->src_;
  } else {
    s = dst;  // a local destination is reached from itself (through lo)
    s.port = id->bound_ ? id->src_.port : (src ? src->port : 0);
  }
  if (!id->bound_) {
    if (auto r = bind_locked(id, s); !r) return r;
  } else if (id->src_.wildcard()) {
    const uint16_t port = id->src_.port;
    id->src_ = s;
    id->src_.port = port;
  }
  const uint32_t sidx = local_gid_index(id->src_, dev).value_or(*dst_idx);
  id->dst_ = dst;
  id->has_device_ = true;
  id->sgid_index_ = static_cast<uint8_t>(sidx);
  id->sgid_ = gid_at(sidx);
  id->dgid_ = gid_at(*dst_idx);
  id->addr_resolved_ = true;
  EventOut ev;
  ev.type = CmEventType::kAddrResolved;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
  return {};
}

Result<void> Service::resolve_multicast_locked(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst) {
  // A group is resolved to the local address the datagrams leave from: the
  // given or bound source, else the one the kernel's route picks (mckey
  // without -b), which must be one of ours; as in the kernel, no route at all
  // is ENETUNREACH. The group itself is the destination GID.
  const auto& dev = engine::device_info();
  IpAddress s;
  if (src && !src->wildcard()) {
    s = *src;
  } else if (id->bound_ && !id->src_.wildcard()) {
    s = id->src_;
  } else {
    auto picked = kernel_source_for(dst);
    if (!picked) return fail(std::errc::network_unreachable);
    s = *picked;
    s.port = id->bound_ ? id->src_.port : (src ? src->port : 0);
  }
  const auto sidx = local_gid_index(s, dev);
  if (!sidx) return fail(std::errc::address_not_available);
  if (!id->bound_) {
    if (auto r = bind_locked(id, s); !r) return r;
  } else if (id->src_.wildcard()) {
    const uint16_t port = id->src_.port;
    id->src_ = s;
    id->src_.port = port;
  }
  id->dst_ = dst;
  id->has_device_ = true;
  id->sgid_index_ = static_cast<uint8_t>(*sidx);
  id->sgid_ = gid_at(*sidx);
  id->dgid_ = dst.addr;
  id->addr_resolved_ = true;
  EventOut ev;
  ev.type = CmEventType::kAddrResolved;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
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
  // address bound, or an address resolved); softhca joins nothing on the
  // network, so the event comes at once.
  if (id->qp_type_ != IBV_QPT_UD || !id->has_device_) return fail(std::errc::invalid_argument);
  EventOut ev;
  ev.type = CmEventType::kMulticastJoin;
  ev.qkey = kUdpQkey;
  ev.mgid = mgid;
  ev.mc_context = context;
  push_event_locked(id->channel_, Event{id, nullptr, id, ev});
  return {};
}

Result<void> Service::listen(CmId* id, int backlog) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  const int effective = backlog > 0 ? std::min(backlog, kMaxBacklog) : kMaxBacklog;
  if (id->listening_) {
    id->backlog_ = effective;
    return {};
  }
  if (id->addr_resolved_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
  if (!id->bound_) {
    if (auto r = bind_locked(id, wildcard_of(AF_INET)); !r) return r;
  }
  table_->set_listening(id->binding_, true);
  id->listening_ = true;
  id->backlog_ = effective;
  listeners_.push_back(id);
  // Test harnesses wait for this line (SOFTHCA_LOG=info): the listener is
  // registered, a connect now reaches it.
  SOFTHCA_INFO("cm: listening on %s (port space 0x%x)", to_string(id->src_).c_str(), id->ps_);
  return {};
}

CmId* Service::find_listener_locked(const BindKey& dst) {
  CmId* wildcard = nullptr;
  for (CmId* l : listeners_) {
    if (l->destroying_) continue;
    const BindKey k = bind_key(l->ps_, l->src_);
    if (!listener_matches(k, dst)) continue;
    if (!k.wildcard) return l;
    if (wildcard == nullptr) wildcard = l;
  }
  return wildcard;
}

// ---- connections --------------------------------------------------------------

void Service::apply_step_locked(CmId* id, Step&& step, std::vector<Outgoing>& out) {
  if (step.send && id->peer_pid_ != 0)
    out.push_back({id->peer_pid_, id->peer_path_, id->comm_id_, encode(Mad{next_tid_locked(id->comm_id_), *step.send})});
  if (step.event && !id->destroying_) {
    push_event_locked(id->channel_, Event{id, nullptr, id, *step.event});
    if (step.event->type == CmEventType::kDisconnected && id->conn_.state() == ConnState::kTimewait) {
      timewait_.emplace(std::chrono::steady_clock::now() + kTimewait, id->comm_id_);
      transport_->wake();  // the CM thread's poll picks up the new deadline
    }
  }
  if (!id->destroying_) sync_retransmit_timer_locked(id);
}

Result<void> Service::connect(CmId* id, const ConnectRequest& req) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    if (!id->route_resolved_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
    auto r = id->qp_type_ == IBV_QPT_UD ? sidr_connect_locked(id, req, out) : connect_locked(id, req, out);
    if (!r) return r;
  }
  send_all(std::move(out));
  return {};
}

namespace {

// rdma_cm's IP header, then the application's bytes.
template <std::size_t N>
void fill_request_private_data(std::array<uint8_t, N>& pd, const IpAddress& src, const IpAddress& dst,
                               std::span<const uint8_t> user) {
  IpHeader hdr;
  hdr.ip_version = src.family == AF_INET6 && dst.family == AF_INET6 ? 6 : 4;
  hdr.src_port = src.port;
  hdr.src = src.addr;
  hdr.dst = dst.addr;
  encode_ip_header(hdr, std::span<uint8_t, kIpHeaderSize>(pd.data(), kIpHeaderSize));
  if (!user.empty()) std::memcpy(pd.data() + kIpHeaderSize, user.data(), user.size());
}
}  // namespace

PathInfo Service::request_path(const CmId& id) {
  PathInfo path;
  path.sgid = id.sgid_;
  path.dgid = id.dgid_;
  path.sgid_index = id.sgid_index_;
  path.traffic_class = id.traffic_class_;
  return path;
}

Result<void> Service::connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out) {
  if (req.private_data.size() > kReqUserPrivateDataSize) return fail(std::errc::invalid_argument);
  ConnectArgs a;
  a.local_comm_id = id->comm_id_;
  a.service_id = service_id(id->ps_, id->dst_.port);
  a.local_ca_guid = engine::device_info().node_guid;
  a.qpn = req.qpn;
  a.srq = req.srq;
  a.starting_psn = random_psn();
  a.responder_resources = req.responder_resources;
  a.initiator_depth = req.initiator_depth;
  a.retry_count = req.retry_count;
  a.rnr_retry_count = req.rnr_retry_count;
  a.flow_control = req.flow_control;
  a.qp_type = id->qp_type_;
  a.path = request_path(*id);
  a.timeouts = request_timeouts();
  fill_request_private_data(a.private_data, id->src_, id->dst_, req.private_data);

  auto step = id->conn_.connect(a);
  if (!step) return fail(step.error());
  // Nobody listening answers as the target's CM would: REJ "invalid service ID".
  RejMsg rej;
  rej.remote_comm_id = id->comm_id_;
  rej.reason = static_cast<uint16_t>(RejReason::kInvalidServiceId);
  send_request_locked(id, std::move(*step), CmMessage(rej), out);
  return {};
}

void Service::send_request_locked(CmId* id, Step&& request, const CmMessage& if_nobody_listens,
                                  std::vector<Outgoing>& out) {
  const auto listener = table_->find_listener(bind_key(id->ps_, id->dst_));
  if (!listener) {
    apply_step_locked(id, id->conn_.on_message(if_nobody_listens), out);
    return;
  }
  id->peer_pid_ = listener->pid;
  id->peer_path_ = listener->socket_path;
  apply_step_locked(id, std::move(request), out);
}

Result<void> Service::sidr_connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out) {
  if (req.private_data.size() > kSidrReqUserPrivateDataSize) return fail(std::errc::invalid_argument);
  SidrArgs a;
  a.local_comm_id = id->comm_id_;
  a.service_id = service_id(id->ps_, id->dst_.port);
  a.path = request_path(*id);
  a.timeouts = request_timeouts();
  fill_request_private_data(a.private_data, id->src_, id->dst_, req.private_data);

  auto step = id->conn_.sidr_request(a);
  if (!step) return fail(step.error());
  // Nobody listening: the target's CM answers "unsupported service".
  SidrRepMsg rep;
  rep.request_id = id->comm_id_;
  rep.status = static_cast<uint8_t>(SidrStatus::kUnsupported);
  send_request_locked(id, std::move(*step), CmMessage(rep), out);
  return {};
}

Result<void> Service::accept(CmId* id, const AcceptRequest& req) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    AcceptArgs a;
    a.qpn = req.qpn;
    a.srq = req.srq;
    a.starting_psn = random_psn();
    a.responder_resources = req.responder_resources;
    a.initiator_depth = req.initiator_depth;
    a.rnr_retry_count = req.rnr_retry_count;
    a.flow_control = req.flow_control;
    a.local_ca_guid = engine::device_info().node_guid;
    a.private_data = req.private_data;
    auto step = id->qp_type_ == IBV_QPT_UD ? id->conn_.sidr_accept(req.qpn, kUdpQkey, req.private_data)
                                          : id->conn_.accept(a);
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

Result<void> Service::reject(CmId* id, std::span<const uint8_t> private_data, uint16_t reason) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.reject(private_data, reason);
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

Result<void> Service::establish(CmId* id) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.establish();
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

Result<void> Service::notify_established(CmId* id) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  auto step = id->conn_.notify_established();
  if (!step) return fail(step.error());
  std::vector<Outgoing> out;
  apply_step_locked(id, std::move(*step), out);
  return {};
}

Result<bool> Service::disconnect(CmId* id) {
  std::vector<Outgoing> out;
  bool expect = false;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.disconnect();
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
    expect = id->conn_.state() == ConnState::kDreqSent ||
             std::any_of(id->channel_->queue_.begin(), id->channel_->queue_.end(),
                         [id](const Event& e) { return e.id == id; });
  }
  send_all(std::move(out));
  return expect;
}

Result<void> Service::set_ack_timeout(CmId* id, uint8_t timeout) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  if (id->qp_type_ != IBV_QPT_RC) return fail(std::errc::invalid_argument);
  id->ack_timeout_ = timeout;
  return {};
}

Result<void> Service::set_tos(CmId* id, uint8_t tos) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  id->tos_ = tos;
  return {};
}

Result<QpAttrPlan> Service::init_qp_attr(CmId* id, ibv_qp_state target) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  auto plan = cm::init_qp_attr(id->conn_, id->qp_type_, 1, 0, kUdpQkey, target);
  if (plan && id->ack_timeout_ && (plan->mask & IBV_QP_TIMEOUT) != 0) plan->attr.timeout = *id->ack_timeout_;
  return plan;
}

// ---- the CM thread's side -------------------------------------------------------

void Service::send_all(std::vector<Outgoing>&& out) {
  for (auto& o : out) {
    auto r = transport_->send(o.pid, o.path, o.bytes);
    if (r) continue;
    SOFTHCA_DEBUG("cm: cannot reach process %u: %s", o.pid, std::make_error_code(r.error()).message().c_str());
    table_->reclaim_if_dead(o.pid);
    if (o.comm_id != 0) peer_unreachable(o.comm_id, o.pid);
  }
}

void Service::peer_unreachable(uint32_t comm_id, uint32_t pid) {
  std::lock_guard g(mu_);
  auto it = ids_.find(comm_id);
  if (it == ids_.end() || it->second->peer_pid_ != pid || it->second->destroying_) return;
  CmId* id = it->second;
  std::vector<Outgoing> ignored;
  if (id->conn_.state() == ConnState::kReqSent) {
    // The listener's process is gone: nobody listens there any more.
    RejMsg rej;
    rej.remote_comm_id = id->comm_id_;
    rej.reason = static_cast<uint16_t>(RejReason::kInvalidServiceId);
    apply_step_locked(id, id->conn_.on_message(CmMessage(rej)), ignored);
  } else if (id->conn_.state() == ConnState::kSidrReqSent) {
    SidrRepMsg rep;
    rep.request_id = id->comm_id_;
    rep.status = static_cast<uint8_t>(SidrStatus::kUnsupported);
    apply_step_locked(id, id->conn_.on_message(CmMessage(rep)), ignored);
  } else {
    apply_step_locked(id, id->conn_.on_peer_lost(), ignored);
  }
}

void Service::on_peer_lost(uint32_t pid) {
  {
    std::lock_guard g(mu_);
    std::vector<Outgoing> ignored;  // nobody to send to
    for (auto& [comm, id] : ids_) {
      if (id->peer_pid_ != pid || id->destroying_) continue;
      apply_step_locked(id, id->conn_.on_peer_lost(), ignored);
    }
  }
  table_->reclaim_if_dead(pid);
}

void Service::on_message(uint32_t pid, std::span<const uint8_t> bytes) {
  auto mad = decode(bytes);
  if (!mad) {
    SOFTHCA_DEBUG("cm: dropping an undecodable message from process %u", pid);
    return;
  }
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (std::holds_alternative<ReqMsg>(mad->msg)) {
      on_req(pid, *mad, out);
    } else if (std::holds_alternative<SidrReqMsg>(mad->msg)) {
      on_sidr_req(pid, *mad, out);
    } else {
      uint32_t local = 0, remote = 0;
      std::visit(
          [&](const auto& m) {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, SidrRepMsg>) {
              local = m.request_id;
            } else if constexpr (!std::is_same_v<T, ReqMsg> && !std::is_same_v<T, SidrReqMsg>) {
              local = m.remote_comm_id;
              remote = m.local_comm_id;
            }
          },
          mad->msg);
      auto it = ids_.find(local);
      CmId* id = it == ids_.end() ? nullptr : it->second;
      const bool stale = id == nullptr || id->destroying_ || id->peer_pid_ != pid ||
                         (id->conn_.remote_comm_id() != 0 && remote != 0 && id->conn_.remote_comm_id() != remote);
      if (stale) {
        if (const auto* dreq = std::get_if<DreqMsg>(&mad->msg)) {
          // The kernel's CM answers a DREQ for an id it no longer has, so the
          // peer does not wait for its DREP timeout.
          DrepMsg drep;
          drep.remote_comm_id = dreq->local_comm_id;
          out.push_back({pid, std::string(), 0, encode(Mad{mad->tid, CmMessage(drep)})});
        }
      } else {
        apply_step_locked(id, id->conn_.on_message(mad->msg), out);
      }
    }
  }
  send_all(std::move(out));
}

CmId* Service::new_passive_id_locked(CmId* listener, uint32_t pid, const IpHeader& hdr, uint16_t port) {
  auto* child = new CmId;
  child->channel_ = listener->channel_;
  child->ps_ = listener->ps_;
  child->qp_type_ = listener->qp_type_;
  child->comm_id_ = next_comm_id_locked();
  child->src_.family = hdr.ip_version == 4 ? AF_INET : AF_INET6;
  child->src_.addr = hdr.dst;
  child->src_.port = port;
  child->dst_.family = child->src_.family;
  child->dst_.addr = hdr.src;
  child->dst_.port = hdr.src_port;
  child->addr_resolved_ = child->route_resolved_ = true;
  child->has_device_ = true;
  const auto& dev = engine::device_info();
  const uint32_t sidx = local_gid_index(child->src_, dev).value_or(0);
  child->sgid_index_ = static_cast<uint8_t>(sidx);
  child->sgid_ = gid_at(sidx);
  child->dgid_ = gid_at(local_gid_index(child->dst_, dev).value_or(sidx));
  child->peer_pid_ = pid;
  return child;
}

void Service::add_passive_locked(CmId* child) {
  ids_[child->comm_id_] = child;
  passive_by_peer_[peer_key(child->peer_pid_, child->conn_.remote_comm_id())] = child;
}

void Service::forget_locked(CmId* id) {
  ids_.erase(id->comm_id_);
  if (id->peer_pid_ != 0) {
    auto it = passive_by_peer_.find(peer_key(id->peer_pid_, id->conn_.remote_comm_id()));
    if (it != passive_by_peer_.end() && it->second == id) passive_by_peer_.erase(it);
  }
}

void Service::on_sidr_req(uint32_t pid, const Mad& mad, std::vector<Outgoing>& out) {
  const SidrReqMsg& req = std::get<SidrReqMsg>(mad.msg);
  if (passive_by_peer_.contains(peer_key(pid, req.request_id))) return;  // a duplicate

  auto reply = [&](SidrStatus status) {
    SidrRepMsg rep;
    rep.request_id = req.request_id;
    rep.status = static_cast<uint8_t>(status);
    rep.service_id = req.service_id;
    out.push_back({pid, std::string(), 0, encode(Mad{mad.tid, CmMessage(rep)})});
  };
  if (!is_ip_service_id(req.service_id)) return reply(SidrStatus::kUnsupported);
  auto hdr = decode_ip_header(std::span<const uint8_t, kIpHeaderSize>(req.private_data.data(), kIpHeaderSize));
  if (!hdr) return reply(SidrStatus::kUnsupported);
  IpAddress local;
  local.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  local.addr = hdr->dst;
  local.port = service_id_port(req.service_id);
  CmId* listener = find_listener_locked(bind_key(service_id_ps(req.service_id), local));
  if (listener == nullptr) return reply(SidrStatus::kUnsupported);
  if (listener->pending_requests_ >= listener->backlog_) return reply(SidrStatus::kReject);

  CmId* child = new_passive_id_locked(listener, pid, *hdr, local.port);
  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  Step step;
  child->conn_ = Connection::from_sidr_req(req, child->comm_id_, path, kIpHeaderSize, step);
  add_passive_locked(child);
  listener->pending_requests_++;
  push_event_locked(listener->channel_, Event{child, listener, listener, *step.event});
}

void Service::on_req(uint32_t pid, const Mad& mad, std::vector<Outgoing>& out) {
  const ReqMsg& req = std::get<ReqMsg>(mad.msg);
  if (auto dup = passive_by_peer_.find(peer_key(pid, req.local_comm_id)); dup != passive_by_peer_.end()) {
    // A duplicate: the sender has not heard from us in time.
    if (!dup->second->destroying_) apply_step_locked(dup->second, dup->second->conn_.on_duplicate_req(), out);
    return;
  }

  auto reject = [&](RejReason reason) {
    RejMsg rej;
    rej.remote_comm_id = req.local_comm_id;
    rej.message_rejected = RejectedMessage::kReq;
    rej.reason = static_cast<uint16_t>(reason);
    out.push_back({pid, std::string(), 0, encode(Mad{mad.tid, CmMessage(rej)})});
  };
  if (!is_ip_service_id(req.service_id)) return reject(RejReason::kInvalidServiceId);
  auto hdr = decode_ip_header(std::span<const uint8_t, kIpHeaderSize>(req.private_data.data(), kIpHeaderSize));
  if (!hdr) return reject(RejReason::kInvalidServiceId);

  IpAddress local;
  local.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  local.addr = hdr->dst;
  local.port = service_id_port(req.service_id);
  CmId* listener = find_listener_locked(bind_key(service_id_ps(req.service_id), local));
  if (listener == nullptr) return reject(RejReason::kInvalidServiceId);
  if (listener->pending_requests_ >= listener->backlog_) return reject(RejReason::kNoResources);

  CmId* child = new_passive_id_locked(listener, pid, *hdr, local.port);
  child->dgid_ = req.primary_local_gid;

  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  path.hop_limit = req.primary_hop_limit != 0 ? req.primary_hop_limit : path.hop_limit;
  path.traffic_class = req.primary_traffic_class;
  path.flow_label = req.primary_flow_label;
  if (req.primary_local_ack_timeout != 0) path.local_ack_timeout = req.primary_local_ack_timeout;
  Step step;
  child->conn_ = Connection::from_req(req, child->comm_id_, random_psn(), path, kIpHeaderSize, step);
  add_passive_locked(child);
  listener->pending_requests_++;
  push_event_locked(listener->channel_, Event{child, listener, listener, *step.event});
  // The MRA: the application answers in its own time, not in the REQ's.
  if (step.send) out.push_back({pid, std::string(), child->comm_id_, encode(Mad{next_tid_locked(child->comm_id_), *step.send})});
}

}  // namespace softhca::cm
