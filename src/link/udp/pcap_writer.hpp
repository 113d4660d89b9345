// Packet captures of the udp link (SOFTHCA_PCAP): every packet it sends and
// receives, as the Ethernet/IP/UDP frame a capture on the wire would show,
// in a pcap file that tshark and Wireshark decode as RoCEv2.
//
// The link sees only UDP payloads (the kernel writes and strips the headers),
// so each frame is rebuilt here: the IP and UDP headers from the flow with
// wire::write_ip_udp_headers, the very image the ICRC was computed over
// (wire/ip_udp.hpp), so a capture's ICRCs check out against its own headers;
// a real UDP checksum (fill_udp_checksum: IPv6 forbids a zero one, and
// readers flag a wrong one); and an Ethernet header with locally
// administered MACs made from the addresses.
//
// The file is written with libpcap's dump API (pcap_dump_open and friends),
// in the nanosecond pcap format.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "wire/ip_udp.hpp"

// libpcap's handles, declared as <pcap/pcap.h> does, so that users of the
// writer do not include libpcap.
struct pcap;
struct pcap_dumper;

namespace softhca::udp {

inline constexpr std::size_t kEthernetHeaderSize = 14;
inline constexpr uint16_t kEthertypeIpv4 = 0x0800;
inline constexpr uint16_t kEthertypeIpv6 = 0x86DD;

// The MAC a capture shows for an address: 02:00 followed by the last four
// bytes of the GID (the IPv4 address itself for IPv4-mapped GIDs), so
// 198.18.0.1 is 02:00:c6:12:00:01. 02 makes it locally administered and
// unicast: no real NIC has it.
std::array<uint8_t, 6> capture_mac(const wire::Gid& gid);

// Writes the whole frame of one packet into `out` and returns its size: the
// Ethernet header, then the flow's IP and UDP headers with their checksums,
// then `udp_payload`; `ipv4_id` is the IPv4 header's ID (the one the
// packet's ICRC was computed over). Pure. invalid_argument for a flow that mixes IPv4 and
// IPv6 or a payload too long for one datagram; no_buffer_space when `out` is
// too small (kEthernetHeaderSize + 48 + the payload always suffice).
Result<std::size_t> build_capture_frame(const wire::UdpFlow& flow, std::span<const uint8_t> udp_payload,
                                        std::span<uint8_t> out, uint16_t ipv4_id = 0);

class PcapWriter {
 public:
  // Creates (or truncates) `path` and writes the pcap file header. The file
  // is opened close-on-exec, so programs the application starts do not hold
  // it. On failure, the errno of the failed open (e.g.
  // no_such_file_or_directory, permission_denied); the caller says which
  // setting named the path.
  static Result<std::unique_ptr<PcapWriter>> open(const std::string& path);
  // The same, but a capture already in `path` is continued rather than
  // replaced (what the udp link does: it starts again each time a process
  // opens the device anew).
  static Result<std::unique_ptr<PcapWriter>> open_append(const std::string& path);

  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Appends one packet: `udp_payload` (BTH to ICRC, as sent or received)
  // carried by `flow` (the sender's view for a sent packet, the peer's for a
  // received one), stamped `time_ns` nanoseconds after the Unix epoch
  // (CLOCK_REALTIME, which readers show as a date), with IPv4 ID `ipv4_id`
  // (a received GSO segment's, see wire::ParseLimits). The record is flushed to
  // the file before write returns, so a process that is killed leaves every
  // packet it wrote readable (the last record may be cut short if the kill
  // lands inside the write). Thread-safe: one mutex, held across the file
  // write (a capture is a debugging aid; its cost is a write(2) per packet).
  // Errors: build_capture_frame's (nothing is written), or io_error when the
  // file refused the record (a full disk: the file may end in part of it).
  Result<void> write(const wire::UdpFlow& flow, std::span<const uint8_t> udp_payload, uint64_t time_ns,
                     uint16_t ipv4_id = 0);

  // Packets written so far.
  uint64_t packets() const;

 private:
  PcapWriter(pcap* handle, pcap_dumper* dumper) : handle_(handle), dumper_(dumper) {}

  mutable std::mutex mutex_;
  pcap* handle_;                // the dead handle that says what the file holds
  pcap_dumper* dumper_;         // the file
  std::vector<uint8_t> frame_;  // guarded by mutex_; reused, so no malloc per packet
  uint64_t packets_ = 0;        // guarded by mutex_
};

// Replaces %p in a SOFTHCA_PCAP value with `pid` and %% with %, so that the
// processes of a test that share one environment write a file each. Other
// characters, a lone % included, are kept.
std::string expand_capture_path(std::string_view pattern, pid_t pid);

// Reads SOFTHCA_PCAP (common/settings): the file to capture into, expanded
// for this process, or nullopt when unset or empty.
std::optional<std::string> pcap_path_from_environment();

}  // namespace softhca::udp
