// The service's transport: the processes of this host through
// LocalTransport, other hosts through RemoteTransport (opened when an id
// first needs to reach them or be reached by them), and the routing that
// takes each MAD from another host to the process of this host it concerns
// (cm/host_routing.hpp): handled here when it is ours, or whenever no other
// live process can be meant (so that a request for nobody is refused and a
// DREQ for a forgotten id answered, by this process's service); otherwise
// relayed to its process, in an envelope that keeps the addresses, over the
// local transport.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "cm/local_transport.hpp"
#include "cm/port_table.hpp"
#include "cm/remote_transport.hpp"
#include "cm/transport.hpp"

namespace softhca::cm {

class RoutingTransport final : public Transport {
 public:
  // `self` is this process's port-table handle (the owner bits of its comm
  // IDs); `table` outlives the transport.
  RoutingTransport(std::unique_ptr<LocalTransport> local, PortTable& table, uint32_t self, uint32_t self_pid)
      : local_(std::move(local)), table_(table), self_(self), self_pid_(self_pid) {}

  Result<void> send(const Peer& to, std::span<const uint8_t> bytes) override;
  // Delivers what the local transport brings (relayed MADs as coming from
  // their host), then what arrived from other hosts for this process.
  void poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost) override;
  void wake() override { local_->wake(); }
  void abandon_after_fork() override;
  void leave_at_exit() override { local_->leave_at_exit(); }
  Result<void> reach_other_hosts(engine::Node& node) override;
  Peer peer_on_other_host(const HostPair& pair) override;

 private:
  // A MAD from another host: to on_message, or relayed to its process.
  void route(const ArrivedMad& arrived, const MessageFn& on_message);

  std::unique_ptr<LocalTransport> local_;
  PortTable& table_;
  const uint32_t self_;
  const uint32_t self_pid_;
  std::mutex mutex_;  // opening remote_, and peers_
  std::unique_ptr<RemoteTransport> remote_;
  std::atomic<RemoteTransport*> remote_ready_{nullptr};
  RemotePeers peers_;
};

}  // namespace softhca::cm
