// Packets between the softhca processes of one host.
//
// Port 4791 is shared by every softhca process of the host (SO_REUSEPORT),
// so the kernel may give a packet to any of them; the one that gets it
// forwards it to the process that owns its destination QP, through that
// process's Unix socket in the host directory (udp-<pid>.sock), with what
// the owner needs to check its ICRC (the addresses and source port).
//
// SOCK_SEQPACKET and connected: a connection's queue is bounded by bytes,
// not by net.unix.max_dgram_qlen packets as an unconnected datagram
// socket's is (ten by default). A sender whose owner's queue is full waits
// for room, and meanwhile takes in what others hand it (two processes
// handing to each other would otherwise each wait for the other), for
// kPatienceNs at most: a stopped or wedged owner costs lost packets (the
// transport recovers them), never a stuck thread, and no more waiting
// until it takes a packet again.
//
// Threads: the receiving thread (the link's receive lock) sends and
// receives; the list of incoming connections has a mutex of its own, since
// the link's thread copies it into its poll set.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "link/udp/udp_sockets.hpp"

namespace softhca::udp {

class ProcessHandoff {
 public:
  // How long a hand-off waits for room in its owner's queue before the
  // packet is given up for lost.
  static constexpr uint64_t kPatienceNs = 25'000'000;

  enum class Result { kHanded, kLost };
  // A packet handed to us, as if received from the network.
  using Handler = std::function<void(const Received& from, std::span<const uint8_t> bytes)>;

  ProcessHandoff() = default;
  ~ProcessHandoff();
  ProcessHandoff(const ProcessHandoff&) = delete;
  ProcessHandoff& operator=(const ProcessHandoff&) = delete;

  // Listens for processes of the host in `host_dir` as process `pid`;
  // false (and a warning logged) when it cannot.
  bool listen(const std::string& host_dir, uint32_t pid);

  // Whether the host has a directory to meet its processes in.
  bool has_host() const { return !host_dir_.empty(); }
  // The listening socket and the incoming connections, for a poll set.
  void add_to(std::vector<pollfd>& fds);
  // Takes in new connections and what they hold (up to 256 packets each).
  void receive(const Handler& handler);
  // Hands process `pid` a packet for its QP `qpn`. `waiting` runs before
  // each wait for room (answers that must not wait with it).
  Result send(uint32_t pid, uint32_t qpn, const Received& from, std::span<const uint8_t> bytes, const Handler& handler,
              const std::function<void()>& waiting);

 private:
  struct Peer {
    int fd = -1;
    bool stalled = false;  // the last wait for it ran out
  };
  Peer* peer(uint32_t pid);
  std::string path(uint32_t pid) const;

  std::string host_dir_;
  uint32_t pid_ = 0;
  int listen_fd_ = -1;
  std::mutex conns_mutex_;  // the list; receiving from them is the receiving thread's
  std::vector<int> conns_;
  // A connection to each owner we hand packets to (by pid).
  std::unordered_map<uint32_t, Peer> peers_;
  bool draining_ = false;  // receive() runs inside a hand-off's wait
};

}  // namespace softhca::udp
