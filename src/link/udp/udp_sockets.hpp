// The sockets of the udp link: one per IP version bound to UDP port 4791
// (SO_REUSEPORT, so that every softhca process of the host can bind it) to
// receive, and one per IP version bound to an ephemeral port to send, so
// that a process's packets carry a source port of its own (RoCEv2 uses it
// as flow entropy). Sends state their source address (IP_PKTINFO), because
// the ICRC covers it; receives learn both addresses the same way.
#pragma once

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
};

// One packet to send: its addresses (the source stated, since the ICRC
// covers it), IP hop limit and traffic class, and its UDP payload.
struct OutgoingPacket {
  wire::Gid src;
  wire::Gid dst;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  std::span<const uint8_t> bytes;
};

class Sockets {
 public:
  // Fails only when neither IP version can receive on port 4791.
  static Result<std::unique_ptr<Sockets>> open();
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
                    std::span<const uint8_t> payload);
  // Sends `packets` in order, a system call per run of one IP version
  // (sendmmsg); returns how many were refused (and are lost, as on a wire).
  size_t send_batch(std::span<const OutgoingPacket> packets);
  // One datagram from receiving socket `fd` into `buffer`; false when none is waiting.
  bool receive(int fd, std::span<uint8_t> buffer, Received& out);
  // Up to out.size() datagrams at once (recvmmsg), datagram i into
  // storage[i * slot_bytes, (i + 1) * slot_bytes); returns how many came.
  int receive_batch(int fd, std::span<uint8_t> storage, size_t slot_bytes, std::span<Received> out);

 private:
  Sockets() = default;
  int recv4_ = -1, recv6_ = -1, send4_ = -1, send6_ = -1;
  uint16_t port4_ = 0, port6_ = 0;
};

}  // namespace softhca::udp
