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
// One transport exists: LocalTransport (cm/local_transport.hpp), between the
// processes of this host. A transport to other hosts (the MADs in UD packets
// to QP1 over the udp link) is meant to be added beside it behind this
// interface, with the state machine untouched.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/result.hpp"

namespace softhca::cm {

// The CM at the other end of an id's connection, as a transport names it.
// Today that is a process of this host: its pid, and the path of its
// endpoint when known (a peer that reached us first is known by pid alone;
// the path is only a way to reach it, not part of who it is).
struct Peer {
  uint32_t pid = 0;  // 0: no peer yet
  std::string path;

  bool known() const { return pid != 0; }
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

 protected:
  Transport() = default;
  Transport(const Transport&) = default;
  Transport& operator=(const Transport&) = default;
};

}  // namespace softhca::cm
