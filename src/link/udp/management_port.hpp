// Management datagrams (MADs to QP1, the GSI) of a process that has no udp
// link: the host's CM agent (tools/cm_agent), which sends the DREQs of
// processes that are gone and, while no other process of the host receives
// on port 4791, answers what comes for them.
//
// ManagementSender holds send sockets only. ManagementListener binds port
// 4791 (SO_REUSEPORT, as every udp link does); the agent opens it only
// while no process of the host has a udp link, since a receiving socket
// there takes its share of every flow the kernel spreads over the port's
// sockets and the agent can hand none of it on.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "link/udp/udp_sockets.hpp"
#include "wire/ip_udp.hpp"

namespace softhca::udp {

inline constexpr std::size_t kGsiMadBytes = 256;

// The UDP payload of a UD SEND of `mad` from QP1 to QP1 with the GSI Q_Key,
// as it leaves from `src` (source port `src_port`) to `dst`: BTH, DETH, the
// MAD and the ICRC over the headers the kernel will write (IPv4 ID 0).
Result<std::vector<uint8_t>> gsi_datagram(const wire::Gid& src, const wire::Gid& dst, uint16_t src_port, uint32_t psn,
                                          std::span<const uint8_t> mad);

// A MAD that came to this host's QP1: who sent it, to which of our
// addresses, and its 256 bytes.
struct ArrivedGsi {
  wire::Gid src{};
  wire::Gid dst{};
  std::array<uint8_t, kGsiMadBytes> mad{};
};

// `bytes` as a UDP payload that came from `from` (its addresses and source
// port): a MAD when it is a UD SEND to QP1 with the GSI Q_Key, at least a
// MAD long, and its ICRC holds (for any IPv4 ID); nullopt otherwise.
std::optional<ArrivedGsi> parse_gsi_datagram(const Received& from, std::span<const uint8_t> bytes);

class ManagementSender {
 public:
  static Result<std::unique_ptr<ManagementSender>> open();
  Result<void> send(const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad);

 private:
  explicit ManagementSender(std::unique_ptr<Sockets> sockets) : sockets_(std::move(sockets)) {}
  std::unique_ptr<Sockets> sockets_;
  uint32_t psn_ = 0;
};

class ManagementListener {
 public:
  static Result<std::unique_ptr<ManagementListener>> open();
  // The sockets to wait on (-1 for an IP version that is not there).
  std::array<int, 2> fds() const { return {sockets_->v4_fd(), sockets_->v6_fd()}; }
  // Every datagram waiting, read; the MADs among them.
  std::vector<ArrivedGsi> take();

 private:
  explicit ManagementListener(std::unique_ptr<Sockets> sockets) : sockets_(std::move(sockets)) {}
  std::unique_ptr<Sockets> sockets_;
};

}  // namespace softhca::udp
