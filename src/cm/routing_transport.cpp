#include "cm/routing_transport.hpp"

#include "cm/host_routing.hpp"
#include "common/log.hpp"

namespace softhca::cm {

Result<void> RoutingTransport::reach_other_hosts(engine::Node& node) {
  if (remote_ready_.load(std::memory_order_acquire) != nullptr) return {};
  std::lock_guard guard(mutex_);
  if (remote_) return {};
  remote_ = RemoteTransport::open(node, [this] { local_->wake(); });
  remote_ready_.store(remote_.get(), std::memory_order_release);
  return {};
}

Peer RoutingTransport::peer_on_other_host(const HostPair& pair) {
  std::lock_guard guard(mutex_);
  Peer p;
  p.pid = peers_.handle_of(pair);
  p.host = pair;
  return p;
}

Result<void> RoutingTransport::send(const Peer& to, std::span<const uint8_t> bytes) {
  if (!to.on_other_host()) return local_->send(to, bytes);
  RemoteTransport* remote = remote_ready_.load(std::memory_order_acquire);
  if (remote == nullptr) return fail(std::errc::network_unreachable);
  // A datagram: whether it arrives, the CM's retransmissions find out.
  remote->send(*to.host, bytes);
  return {};
}

void RoutingTransport::poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost) {
  local_->poll_once(
      timeout_ms,
      [&](const Peer& from, std::span<const uint8_t> bytes) {
        if (auto relayed = decode_relayed(bytes)) {
          // Another process of this host passed us a MAD of another host's:
          // ours by its routing, so no routing again.
          on_message(peer_on_other_host(HostPair{relayed->remote, relayed->local}), relayed->mad);
          return;
        }
        on_message(from, bytes);
      },
      on_lost);
  RemoteTransport* remote = remote_ready_.load(std::memory_order_acquire);
  if (remote == nullptr) return;
  for (const ArrivedMad& arrived : remote->take()) route(arrived, on_message);
}

void RoutingTransport::route(const ArrivedMad& arrived, const MessageFn& on_message) {
  const Peer from = peer_on_other_host(arrived.from);
  std::optional<ListenerInfo> owner;
  if (auto mad = decode(arrived.mad)) {
    const MadRoute r = route_of(*mad);
    if (r.by == MadRoute::By::kListener)
      owner = table_.find_listener(r.listener);
    else if (r.by == MadRoute::By::kCommId && comm_id_owner(r.comm_id) != self_)
      owner = table_.find_process(comm_id_owner(r.comm_id));
  }
  if (owner && owner->pid != self_pid_) {
    RelayedMad relayed;
    relayed.remote = arrived.from.remote;
    relayed.local = arrived.from.local;
    relayed.mad = arrived.mad;
    const auto envelope = encode_relayed(relayed);
    if (local_->send(Peer{owner->pid, owner->socket_path, std::nullopt}, envelope)) {
      SOFTHCA_DEBUG("cm: passed a MAD from another host on to process %u", owner->pid);
      return;
    }
    SOFTHCA_DEBUG("cm: cannot pass a MAD from another host on to process %u; answering it here", owner->pid);
  }
  on_message(from, arrived.mad);
}

void RoutingTransport::abandon_after_fork() {
  local_->abandon_after_fork();
  // The child has no udp link thread and its node was forgotten (engine
  // Node's fork handler): let the parent's objects go without touching them.
  [[maybe_unused]] RemoteTransport* leaked = remote_.release();
  remote_ready_.store(nullptr, std::memory_order_relaxed);
}

}  // namespace softhca::cm
