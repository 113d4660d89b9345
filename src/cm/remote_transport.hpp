// How CM messages travel between hosts: MADs in UD packets to QP1 over the
// udp link (engine::Node::send_mad / receive_mads), as RoCE NICs send them,
// so that captures decode as CM and a real peer could answer.
//
// A peer on another host is named by a handle (cm/transport.hpp) standing
// for the pair (the other host's address, ours as that host addresses us),
// both as GIDs; RemotePeers hands them out. Datagrams have no connection to break,
// so a host that goes away is noticed by the CM's own retransmission
// timeouts, not here.
//
// Threads: MADs arrive on whichever thread receives packets; they are
// queued here and `wake` is called, so that the CM thread takes them
// (take) under its own lock. The other calls may come from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cm/mad_codec.hpp"
#include "cm/transport.hpp"
#include "common/result.hpp"

namespace softhca::engine {
class Node;
}

namespace softhca::cm {

// A MAD that arrived from another host.
struct ArrivedMad {
  HostPair from;
  MadBytes mad{};
};

// Handles for peers on other hosts (kRemotePeerBit set): stable for a
// pair, never reused. Not thread-safe: its owner's lock guards it.
class RemotePeers {
 public:
  uint32_t handle_of(const HostPair& pair);
  std::optional<HostPair> find(uint32_t handle) const;

 private:
  std::vector<HostPair> pairs_;
};

class RemoteTransport {
 public:
  // Starts taking the MADs that reach this host's QP1 through `node`'s udp
  // link (this process becomes the host's GSI agent if there is none).
  // `node` is libibverbs.so.1's (see abi/rdmacm/device.cpp) and outlives
  // the transport.
  static std::unique_ptr<RemoteTransport> open(engine::Node& node, std::function<void()> wake);
  ~RemoteTransport();
  RemoteTransport(const RemoteTransport&) = delete;
  RemoteTransport& operator=(const RemoteTransport&) = delete;

  // Sends a MAD from our address `to.local` to QP1 of `to.remote`. Like any
  // datagram it may be lost: the CM retransmits.
  void send(const HostPair& to, std::span<const uint8_t> mad);
  // The MADs that arrived since the last call, oldest first.
  std::vector<ArrivedMad> take();

 private:
  RemoteTransport(engine::Node* node, std::function<void()> wake) : node_(node), wake_(std::move(wake)) {}

  engine::Node* node_;
  std::function<void()> wake_;
  std::mutex mutex_;
  std::deque<ArrivedMad> arrived_;
};

}  // namespace softhca::cm
