// The seam between the CM service and the ways its messages travel.
//
// The service (cm/service.hpp) runs the connection state machine
// (cm/connection.hpp), which knows nothing of transports: it takes a message
// and gives at most one back. The service addresses what it sends to a Peer
// and hands it to a Transport in one place (service_messages.cpp); the CM
// thread's loop (service.cpp) waits in the transport's poll_once, which
// delivers what arrives and which peers were lost. A message is one encoded
// MAD (cm/mad_codec.hpp), whatever carries it.
//
// LocalTransport (cm/local_transport.hpp) carries messages between the
// processes of this host, RemoteTransport (cm/remote_transport.hpp) to and
// from other hosts, as MADs in UD packets to QP1 over the udp link; the
// service uses RoutingTransport (cm/routing_transport.hpp), which joins the
// two and passes each MAD from another host to the process it concerns.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "cm/mad_codec.hpp"
#include "common/result.hpp"

namespace softhca::engine {
class Node;
}

namespace softhca::cm {

// A CM on another host: its address and ours as it addresses us, as GIDs
// (RoCE v2: IPv4 as ::ffff:a.b.c.d).
struct HostPair {
  Gid remote{};
  Gid local{};
  bool operator==(const HostPair&) const = default;
};

// Peers on other hosts are named by a handle where a process of this host
// is named by its pid: the top bit, which no pid has, is set.
inline constexpr uint32_t kRemotePeerBit = 0x80000000u;
constexpr bool is_remote_peer(uint32_t pid_or_handle) { return (pid_or_handle & kRemotePeerBit) != 0; }

// The CM at the other end of an id's connection, as a transport names it:
// a process of this host (its pid, and the path of its endpoint when known;
// a peer that reached us first is known by pid alone, the path is only a
// way to reach it, not part of who it is), or a CM on another host (a
// handle, and the addresses).
struct Peer {
  uint32_t pid = 0;  // 0: no peer yet; a handle (is_remote_peer) for another host
  std::string path;
  std::optional<HostPair> host;  // set for a peer on another host

  bool known() const { return pid != 0; }
  bool on_other_host() const { return host.has_value(); }
  // Whether both name the same CM.
  bool same_cm(const Peer& other) const { return pid == other.pid; }
};

class Transport {
 public:
  using MessageFn = std::function<void(const Peer& from, std::span<const uint8_t> bytes)>;
  using LostFn = std::function<void(const Peer& peer)>;

  virtual ~Transport() = default;

  // Sends one message. Any error means the peer cannot be reached now; the
  // service fails the id that sent it as it fails the ids of a lost peer.
  virtual Result<void> send(const Peer& to, std::span<const uint8_t> bytes) = 0;

  // One round of the CM thread: waits up to timeout_ms (-1: forever) for
  // input or wake(), then calls on_message for each message received and
  // on_lost for each peer known to be gone (its ids cannot hear back).
  virtual void poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost) = 0;

  // Makes a poll_once in progress return, so that the CM thread sees an
  // earlier deadline.
  virtual void wake() = 0;

  // In a forked child, whose CM thread does not exist: lets go of every
  // descriptor without taking locks.
  virtual void abandon_after_fork() = 0;

  // At process exit (the CM thread may still run): removes what lets other
  // CMs find this one.
  virtual void leave_at_exit() = 0;

  // Starts taking messages from other hosts (a listener that other hosts
  // may reach, an id that connects to one). Errors: not_supported for a
  // transport that reaches only this host, or what stops the link.
  // `node` is the engine node whose udp link carries them.
  virtual Result<void> reach_other_hosts(engine::Node& /*node*/) { return fail(std::errc::not_supported); }
  // The peer for the CM of another host (a stable handle per pair); an
  // unknown peer from a transport that reaches only this host.
  virtual Peer peer_on_other_host(const HostPair& pair) {
    Peer p;
    p.host = pair;
    return p;
  }

 protected:
  Transport() = default;
  Transport(const Transport&) = default;
  Transport& operator=(const Transport&) = default;
};

}  // namespace softhca::cm
