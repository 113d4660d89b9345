// Management datagrams (MADs to QP1, the GSI) sent by a process that has
// no udp link: the host's CM agent (tools/cm_agent), which sends the DREQs
// of processes that are gone. It holds send sockets only and never binds
// port 4791: a receiving socket there would take its share of every flow
// the kernel spreads over the port's sockets (SO_REUSEPORT), and hand each
// such packet on to its owner, one hop more for the applications' traffic.
// What answers the agent's DREQs reaches the processes that receive, which
// end the departures in the shared table (cm/departure_table.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "link/udp/udp_sockets.hpp"
#include "wire/ip_udp.hpp"

namespace softhca::udp {

// The UDP payload of a UD SEND of `mad` from QP1 to QP1 with the GSI Q_Key,
// as it leaves from `src` (source port `src_port`) to `dst`: BTH, DETH, the
// MAD and the ICRC over the headers the kernel will write (IPv4 ID 0).
Result<std::vector<uint8_t>> gsi_datagram(const wire::Gid& src, const wire::Gid& dst, uint16_t src_port, uint32_t psn,
                                          std::span<const uint8_t> mad);

class ManagementSender {
 public:
  static Result<std::unique_ptr<ManagementSender>> open();
  Result<void> send(const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad);

 private:
  explicit ManagementSender(std::unique_ptr<Sockets> sockets) : sockets_(std::move(sockets)) {}
  std::unique_ptr<Sockets> sockets_;
  uint32_t psn_ = 0;
};

}  // namespace softhca::udp
