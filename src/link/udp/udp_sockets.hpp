// The sockets of the udp link: one per IP version bound to UDP port 4791
// (SO_REUSEPORT, so that every softhca process of the host can bind it) to
// receive, and one per IP version bound to an ephemeral port to send, so
// that a process's packets carry a source port of its own (RoCEv2 uses it
// as flow entropy). Sends state their source address (IP_PKTINFO), because
// the ICRC covers it; receives learn both addresses the same way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/result.hpp"
#include "wire/ip_udp.hpp"

namespace softhca::udp {

struct Received {
  wire::Gid src{};
  wire::Gid dst{};
  uint16_t src_port = 0;
  size_t length = 0;
  // Several datagrams of one flow that the kernel coalesced (UDP_GRO): each
  // is segment_size bytes long but the last, which may be shorter. 0: one.
  size_t segment_size = 0;
};

// One packet to send: its addresses (the source stated, since the ICRC
// covers it), IP hop limit and traffic class, its UDP payload, and for a
// multicast group the interface it leaves through (0: the kernel's choice).
struct OutgoingPacket {
  wire::Gid src;
  wire::Gid dst;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  std::span<const uint8_t> bytes;
  uint32_t ifindex = 0;
};

// GSO (UDP_SEGMENT): a run of packets to one destination, all of one size
// but the last, which may be shorter, leaves in one message that the kernel
// (or the NIC) cuts into datagrams; over a veth or loopback it crosses the
// stack once. Every packet is already whole (its own BTH, PSN and ICRC), so
// the segments are exactly the datagrams that would have been sent one by
// one, but for the IPv4 ID: the kernel numbers the segments' IDs from 0 up
// where a lone datagram has 0, and the ICRC covers the ID, so send_batch
// gives segment i the ICRC over ID i (wire::icrc_ipv4_id_delta) and a
// receiver accepts IDs below kGsoMaxSegments (wire::ParseLimits). Bounded by
// the kernel's segment count (UDP_MAX_SEGMENTS) and by one IP datagram's
// size.
inline constexpr size_t kGsoMaxSegments = 64;
inline constexpr size_t kGsoMaxBytes = 65000;

// How many packets from the start of `packets` (at most `most`) go in one GSO
// message (1: on its own).
size_t gso_run(std::span<const OutgoingPacket> packets, size_t most);

struct SocketOptions {
  bool gso = true;      // send runs as GSO messages (SOFTHCA_UDP_GSO)
  bool receive = true;  // false: send sockets only, port 4791 left to the processes that receive
};

class Sockets {
 public:
  // Fails only when neither IP version can receive on port 4791 (or, with
  // options.receive false, send).
  static Result<std::unique_ptr<Sockets>> open(const SocketOptions& options = {});
  ~Sockets();
  Sockets(const Sockets&) = delete;
  Sockets& operator=(const Sockets&) = delete;

  // The receiving sockets (-1 where that IP version is unavailable).
  int v4_fd() const { return recv4_; }
  int v6_fd() const { return recv6_; }
  // The source port of what this process sends over IPv4 (true) or IPv6.
  uint16_t source_port(bool v4) const { return v4 ? port4_ : port6_; }

  // Sends one UDP payload from `src` to `dst`, port 4791.
  Result<void> send(const wire::Gid& src, const wire::Gid& dst, uint8_t traffic_class, uint8_t hop_limit,
                    std::span<const uint8_t> payload, uint32_t ifindex = 0);
  // Joins (or leaves) IP multicast group `group` (IPv4-mapped or IPv6) on
  // interface `ifindex`: the receiving socket of its IP version then gets
  // what is sent to the group there. Only a socket that joined a group gets
  // its datagrams (IP_MULTICAST_ALL off), and what this process sends to a
  // group does not come back to this host (multicast loopback off: the
  // host's own members get it through shared memory).
  Result<void> membership(const wire::Gid& group, uint32_t ifindex, bool join);
  // Sends `packets` in order, a system call per run of one IP version
  // (sendmmsg), runs of equal-size packets as GSO messages (gso_run);
  // returns how many were refused (and are lost, as on a wire).
  size_t send_batch(std::span<const OutgoingPacket> packets);
  // One datagram from receiving socket `fd` into `buffer`; false when none is waiting.
  bool receive(int fd, std::span<uint8_t> buffer, Received& out);
  // Up to out.size() datagrams at once (recvmmsg), datagram i into
  // storage[i * slot_bytes, (i + 1) * slot_bytes); returns how many came.
  // One may be a coalesced run of datagrams (Received::segment_size): a slot
  // of 64 KiB holds any.
  int receive_batch(int fd, std::span<uint8_t> storage, size_t slot_bytes, std::span<Received> out);

 private:
  Sockets() = default;
  int recv4_ = -1, recv6_ = -1, send4_ = -1, send6_ = -1;
  // Whether send_batch sends runs as GSO messages: as asked, until the
  // kernel refuses one for want of segmentation offload.
  std::atomic<bool> gso_{true};
  uint16_t port4_ = 0, port6_ = 0;
};

}  // namespace softhca::udp
