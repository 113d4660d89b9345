// Management datagrams (MADs to QP1, the GSI) sent by a process that has
// no udp link: the host's CM agent (tools/cm_agent), which sends the DREQs
// (and REJs) of processes that are gone. Send sockets only: it never binds
// port 4791. A receiving socket there takes its share of every flow the
// kernel spreads over the port's sockets (SO_REUSEPORT) and could hand none
// of it on: tried, holding the port only while no other process of the host
// was left, a process starting meanwhile lost the UD datagrams the kernel
// gave the agent before its next look (rxe.interop's udaddy, softhca the
// client). What answers the agent's messages reaches the processes that
// receive, which end the departures in the shared table
// (cm/departure_table.hpp).
#pragma once

#include <cstdint>
#include <memory>
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
