// The CM service's life and its thread: the process's one instance (and
// what fork and exit do to it), the CM thread's loop, the retransmission and
// timewait timers, and applying a state machine step to an id. The calls
// themselves are defined in the other service_*.cpp (see cm/service.hpp).
#include "cm/service.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>

#include "cm/routing_transport.hpp"
#include "cm/service_internal.hpp"
#include "common/log.hpp"
#include "common/limits.hpp"
#include "engine/device/device_info.hpp"
#include "host/host_identity.hpp"
#include "host/host_registry.hpp"

namespace softhca::cm {
namespace detail {

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

uint8_t path_mtu_at(uint32_t index) {
  const auto* e = engine::device_info().gid_at(index);
  return static_cast<uint8_t>(engine::mtu_enum(e != nullptr && e->mtu != 0 ? e->mtu : 4096));
}

}  // namespace detail

namespace {

// How long a disconnected connection stays in timewait before TIMEWAIT_EXIT:
// about the kernel's (4.096 us << the RoCE ack timeout of ~17).
constexpr std::chrono::milliseconds kTimewait{500};
// At exit, unanswered DREQs go again this often, for this long at most: the
// exit waits for their DREPs (a peer that answers at all answers within a
// round trip; at 20% loss each way, 30 tries all fail with p = 0.36^30).
constexpr uint32_t kExitResendMs = 50;
constexpr uint32_t kExitLingerMs = 1500;
// A DREP at exit goes this many more times, kExitResendMs apart.
constexpr uint8_t kExitRepeats = 3;

alignas(std::mutex) unsigned char g_init_mu_storage[sizeof(std::mutex)];
std::mutex* g_init_mu = new (g_init_mu_storage) std::mutex;
Service* g_service = nullptr;
pid_t g_service_pid = 0;
bool g_hooks_installed = false;

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
  g_service->tell_other_hosts_at_exit();
  g_service->linger_at_exit();
  g_service->table_->unregister_process(g_service->proc_);
  g_service->transport_->leave_at_exit();
}

void Service::tell_other_hosts_at_exit() {
  // What the kernel does for the ids of a closed rdma_cm file, for the
  // peers that would not notice otherwise: a process of this host sees our
  // connections break, another host would wait out its timeouts (say, for
  // the DREP of a DREQ that arrived just before the exit and whose answer
  // had not left yet: it goes again). Ours cross theirs: a DREQ meeting the
  // peer's own DREQ is answered and ends both.
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    for (auto& [comm, id] : ids_) {
      if (id->destroying_ || !id->peer_.on_other_host()) continue;
      if (const auto d = id->conn_.departure()) depart_locked(id, *d);
      const bool timewait = id->conn_.state() == ConnState::kTimewait;
      Step step = id->conn_.on_exit();
      if (!step.send) continue;
      out.push_back(message_to_peer_locked(id, *step.send, IfUnreachable::kIgnore));
      // The DREP that answered the peer's DREQ may have been lost, and once
      // this process is gone nobody answers the peer's DREQ again: it would
      // wait out every retry (rdma_server at 20% loss, whose client had
      // exited). It goes a few more times while the exit lingers.
      if (timewait) remember_drep_locked(id->comm_id_, out.back());
    }
  }
  send_all(std::move(out));
  // And what the CM thread had decided to send before the exit began: an
  // event it queued may be what let the application exit.
  wait_for_unsent_at_exit();
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
  auto local = LocalTransport::open(path);
  if (!local) return fail(local.error());
  start_time_ = host::process_start_time(pid);
  auto proc = table_->register_process(pid, start_time_, path);
  if (!proc) return fail(proc.error());
  proc_ = *proc;
  transport_ = std::make_unique<RoutingTransport>(std::move(*local), *table_, proc_, pid);
  if (auto departures = DepartureTable::open()) {
    departure_table_ = *departures;
    if (auto host_dir = host::host_directory()) agent_ = std::make_unique<AgentLauncher>(*host_dir);
  } else {
    SOFTHCA_WARN("cm: no departure table (%s): connections of this process to other hosts stay up for their peers "
                 "if it is killed",
                 std::make_error_code(departures.error()).message().c_str());
  }
  comm_id_seed_ = detail::rng()();

  // The CM thread takes no asynchronous signals: they belong to the
  // application's threads. The synchronous ones stay open: a fault with its
  // signal blocked kills the process at once, and the CM thread does fault
  // on purpose when it writes next to a buffer that ibv_reg_mr is moving
  // into the shared file (host/write_guard parks it until the move is done).
  sigset_t all, old;
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, sig);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "softhca-cm");  // named: ps, gdb and tests tell ours apart
      run();
    }).detach();
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
        next_timeout_ms(), [this](const Peer& from, std::span<const uint8_t> bytes) { on_message(from, bytes); },
        [this](const Peer& peer) { on_peer_lost(peer); });
    fire_timers();
    check_neighbours();
  }
}

int Service::next_timeout_ms() {
  std::lock_guard g(mu_);
  std::optional<std::chrono::steady_clock::time_point> next;
  if (!timewait_.empty()) next = timewait_.begin()->first;
  if (!retransmit_.empty() && (!next || retransmit_.begin()->first < *next)) next = retransmit_.begin()->first;
  if (!addr_checks_.empty() && (!next || addr_checks_.begin()->first < *next)) next = addr_checks_.begin()->first;
  for (const auto& [comm, d] : departures_)
    if (!next || d.next < *next) next = d.next;
  if (!next) return -1;
  const auto left = *next - std::chrono::steady_clock::now();
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, 60'000));
}

void Service::fire_timers() {
  std::vector<Outgoing> out;
  std::unique_lock lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  while (const auto due = pop_due_locked(timewait_, now)) {
    CmId* id = due->second;
    if (id == nullptr || id->destroying_ || id->conn_.state() != ConnState::kTimewait) continue;
    EventOut ev;
    ev.type = CmEventType::kTimewaitExit;
    push_event_locked(id->channel_, Event{id, nullptr, id, ev});
  }
  while (const auto due = pop_due_locked(retransmit_, now)) {
    const auto [comm, id] = *due;
    if (id == nullptr) continue;
    id->rt_timer_.reset();
    if (id->destroying_) continue;
    Step step = id->conn_.on_timeout(id->rt_generation_);
    if (step.send)
      SOFTHCA_DEBUG("cm: id %u: no answer to %s in time, sending it again", comm, message_name(*step.send));
    apply_step_locked(id, std::move(step), out);
  }
  fire_departures_locked(now, out);
  send_all(lk, std::move(out));
}

void Service::keep_departure_locked(uint32_t comm, Outgoing message, uint32_t wait_ms, uint8_t retries,
                                    std::chrono::milliseconds first_in, bool repeat_only) {
  Departure dep;
  dep.message = std::move(message);
  dep.message.comm_id = 0;  // no id to fail
  dep.wait_ms = wait_ms;
  dep.retries = retries;
  dep.repeat_only = repeat_only;
  dep.next = std::chrono::steady_clock::now() + first_in;
  departures_[comm] = std::move(dep);
  transport_->wake();  // the CM thread's poll picks up the new deadline
  if (!repeat_only) sync_will_locked(comm, nullptr);
}

void Service::sync_will_locked(uint32_t comm, const CmId* id) {
  if (departure_table_ == nullptr) return;
  // What must reach the peer should this process die now: a departure under
  // way, the DREQ the id's connection would send (retried), or in the
  // handshake what destroying the id sends (a REJ, a SIDR_REP; once, as
  // the kernel's CM sends it for a process killed mid-handshake).
  struct Will {
    Peer to;
    MadBytes bytes;
    uint32_t wait_ms = 0;
    uint8_t retries = 0;
  };
  std::optional<Will> will;
  const auto dep = departures_.find(comm);
  if (dep != departures_.end() && !dep->second.repeat_only) {
    will = Will{dep->second.message.to, dep->second.message.bytes, dep->second.wait_ms, dep->second.retries};
  } else if (id != nullptr && !id->destroying_ && id->peer_.on_other_host()) {
    const uint64_t tid = uint64_t{comm} << 32;
    if (const auto d = id->conn_.departure()) {
      will = Will{id->peer_, encode(Mad{tid, CmMessage(d->dreq)}), d->wait_ms, d->retries};
    } else if (id->conn_.has_cm()) {
      Connection destroyed = id->conn_;
      if (const Step step = destroyed.on_destroy(); step.send)
        will = Will{id->peer_, encode(Mad{tid, *step.send}), 0, 0};
    }
  }
  const auto written = wills_.find(comm);
  if (!will || !will->to.host) {
    if (written == wills_.end()) return;
    departure_table_->free(written->second.slot, static_cast<uint32_t>(::getpid()), comm);
    wills_.erase(written);
    return;
  }
  // The same message to the same peer stands as written.
  uint64_t digest = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const uint8_t b : will->bytes) digest = (digest ^ b) * 0x100000001b3ULL;
  if (written != wills_.end() && written->second.digest == digest) return;
  DepartureRecord r;
  r.pid = static_cast<uint32_t>(::getpid());
  r.start_time = start_time_;
  r.local_comm_id = comm;
  r.local = will->to.host->local;
  r.remote = will->to.host->remote;
  r.mad = will->bytes;
  r.wait_ms = will->wait_ms;
  r.retries = will->retries;
  const bool fresh = written == wills_.end();
  auto slot = departure_table_->write(fresh ? std::nullopt : std::optional<uint32_t>(written->second.slot), r);
  if (!slot) {
    SOFTHCA_DEBUG("cm: the departure table is full; comm id %u has no record", comm);
    return;
  }
  wills_[comm] = WillRecord{*slot, digest};
  if (fresh && agent_) agent_->ensure_running();
}

void Service::end_orphan_departure_locked(uint32_t local, const Peer& from) {
  if (departure_table_ == nullptr || !from.host) return;
  if (departure_table_->end(local, from.host->remote))
    SOFTHCA_DEBUG("cm: comm id %u of a process that is gone: its peer answered the agent's DREQ", local);
}

void Service::depart_locked(CmId* id, const Connection::Departure& d) {
  const uint32_t wait_ms = exiting_ ? kExitResendMs : d.wait_ms;
  keep_departure_locked(id->comm_id_, message_to_peer_locked(id, CmMessage(d.dreq), IfUnreachable::kIgnore), wait_ms,
                        d.retries, std::chrono::milliseconds(wait_ms), false);
}

void Service::remember_drep_locked(uint32_t comm, const Outgoing& drep) {
  // Sent only if the exit comes within the timewait (linger_at_exit).
  keep_departure_locked(comm, drep, kExitResendMs, 0, kTimewait, true);
}

void Service::end_departure_locked(uint32_t local, const Peer& from) {
  const auto it = departures_.find(local);
  if (it == departures_.end() || it->second.repeat_only || !it->second.message.to.same_cm(from)) return;
  departures_.erase(it);
  if (departures_.empty()) departures_cv_.notify_all();
  const auto id = ids_.find(local);
  sync_will_locked(local, id == ids_.end() ? nullptr : id->second);
}

void Service::fire_departures_locked(std::chrono::steady_clock::time_point now, std::vector<Outgoing>& out) {
  for (auto it = departures_.begin(); it != departures_.end();) {
    Departure& d = it->second;
    if (d.next > now) {
      ++it;
      continue;
    }
    if (d.retries == 0) {
      if (!d.repeat_only) SOFTHCA_DEBUG("cm: comm id %u: no DREP for the DREQ of a destroyed id; giving up", it->first);
      const uint32_t comm = it->first;
      it = departures_.erase(it);
      if (departures_.empty()) departures_cv_.notify_all();
      const auto id = ids_.find(comm);
      sync_will_locked(comm, id == ids_.end() ? nullptr : id->second);
      continue;
    }
    --d.retries;
    out.push_back(d.message);
    d.next = now + std::chrono::milliseconds(d.wait_ms);
    ++it;
  }
}

void Service::linger_at_exit() {
  std::unique_lock lk(mu_);
  if (departures_.empty()) return;
  // The DREQs that are not answered yet go again, often, while the process
  // still may: once it is gone nobody sends them (docs/architecture.md,
  // "A connection outlives its id").
  exiting_ = true;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [comm, d] : departures_) {
    if (d.repeat_only) {  // a connection in TIMEWAIT: its DREP, sent once already, again
      d.retries = kExitRepeats;
      d.next = now + std::chrono::milliseconds(kExitResendMs);
      continue;
    }
    d.wait_ms = kExitResendMs;
    d.retries = std::max<uint8_t>(d.retries, kExitLingerMs / kExitResendMs);
    d.next = std::min(d.next, now + std::chrono::milliseconds(kExitResendMs));
  }
  transport_->wake();
  if (!departures_cv_.wait_until(lk, now + std::chrono::milliseconds(kExitLingerMs),
                                 [this] { return departures_.empty(); }))
    SOFTHCA_INFO("cm: %zu peer(s) on other hosts did not answer the disconnection before the exit",
                 departures_.size());
}

std::optional<std::pair<uint32_t, CmId*>> Service::pop_due_locked(
    std::multimap<std::chrono::steady_clock::time_point, uint32_t>& queue, std::chrono::steady_clock::time_point now) {
  if (queue.empty() || queue.begin()->first > now) return std::nullopt;
  const uint32_t comm = queue.begin()->second;
  queue.erase(queue.begin());
  const auto it = ids_.find(comm);
  return std::pair{comm, it == ids_.end() ? nullptr : it->second};
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

void Service::apply_step_locked(CmId* id, Step&& step, std::vector<Outgoing>& out) {
  if (step.send && id->peer_.known())
    out.push_back(message_to_peer_locked(id, *step.send, IfUnreachable::kFailId));
  if (step.event && !id->destroying_) {
    push_event_locked(id->channel_, Event{id, nullptr, id, *step.event});
    if (step.event->type == CmEventType::kDisconnected && id->conn_.state() == ConnState::kTimewait) {
      timewait_.emplace(std::chrono::steady_clock::now() + kTimewait, id->comm_id_);
      transport_->wake();  // the CM thread's poll picks up the new deadline
    }
  }
  if (!id->destroying_) sync_retransmit_timer_locked(id);
  sync_will_locked(id->comm_id_, id);
}

}  // namespace softhca::cm
