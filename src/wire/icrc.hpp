// The RoCEv2 invariant CRC (IBTA vol. 1 annex A17): the last four bytes of
// every packet, a CRC-32 over the parts of the packet that no router may
// change, so that end-to-end corruption is caught even where IP and UDP
// checksums are recomputed or absent.
//
// It covers, in order: eight 0xFF bytes standing for InfiniBand's LRH (which
// RoCEv2 does not have); the IP header with its per-hop fields set to all
// ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop
// limit); the UDP header with its checksum set to all ones; the BTH with its
// byte 4 (FECN, BECN and the reserved bits, which switches may mark) set to
// all ones; then everything after the BTH up to the ICRC, pad bytes included.
// The CRC is the CRC-32 of Ethernet and zlib (wire/crc32.hpp) and goes on the
// wire least significant byte first, as the kernel's rxe and scapy write it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "common/result.hpp"
#include "wire/headers.hpp"

namespace softhca::wire {

inline constexpr std::size_t kIcrcSize = 4;

// The ICRC of the packet whose IP and UDP headers are `ip_udp_headers` (as
// check_ip_udp_headers accepts them) and whose UDP payload is `udp_payload`:
// BTH to pad followed by the four ICRC bytes, whose content is not read.
// invalid_argument when the headers are not of that form or their lengths do
// not describe `udp_payload`, or when it is shorter than a BTH and an ICRC.
Result<uint32_t> icrc_of(std::span<const uint8_t> ip_udp_headers, std::span<const uint8_t> udp_payload);

// The same for a whole IP packet (split_ip_udp), ICRC bytes included.
Result<uint32_t> icrc_of(std::span<const uint8_t> ip_packet);

// The ICRC in two steps, for packets that share their IP and UDP headers (a
// run of equal segments: one flow, one length): the CRC over the masked
// image of those headers, once (icrc_prefix, which checks them as icrc_of
// does), then for each packet the rest from there (icrc_after_prefix).
struct IcrcPrefix {
  uint32_t crc = 0;                  // after the pseudo-LRH and the masked IP and UDP headers
  std::size_t udp_payload_size = 0;  // the length the headers describe
  bool ipv4_id0 = false;             // an IPv4 image whose ID is 0 (see ipv4_id_behind_icrc)
};
Result<IcrcPrefix> icrc_prefix(std::span<const uint8_t> ip_udp_headers, std::size_t udp_payload_size);
// `udp_payload` is prefix.udp_payload_size bytes, at least a BTH and an ICRC.
uint32_t icrc_after_prefix(const IcrcPrefix& prefix, std::span<const uint8_t> udp_payload);

// How the ICRC of an IPv4 packet whose UDP payload is `udp_payload_size`
// bytes long (BTH to ICRC) changes when its IP ID is `ip_id` instead of 0:
//   icrc(ID = ip_id) == icrc(ID = 0) ^ icrc_ipv4_id_delta(ip_id, size).
// The CRC is linear and the two headers differ only in the ID (and in the
// header checksum, which the ICRC masks), so the difference is the CRC,
// without its initial value and final xor, of the ID bytes followed by as
// many zero bytes as the packet has after them: a function of the ID and
// the length only. This is what lets the sender of a GSO run give segment i
// the ICRC of the ID the kernel will write into it, and a receiver, which
// never sees the ID, recognise such a segment.
uint32_t icrc_ipv4_id_delta(uint16_t ip_id, std::size_t udp_payload_size);

// The IPv4 ID (1..65535) under which a packet whose ICRC over the ID-0
// header image is `icrc_id0` carries `received` instead, or nullopt when no
// ID does (a corrupted packet). `udp_payload_size` as above. The difference
// of the two ICRCs is an ID's value times a power of x mod the CRC's
// polynomial (see icrc_ipv4_id_delta), so one multiplication by the inverse
// power solves it: a receiver that cannot see the ID (a UDP socket) takes
// any sender's packets, whatever IDs its kernel writes (rxe's are the
// kernel's running per-destination counter), at the price of the ICRC's
// strength: 65,535 of the 2^32 possible differences now pass for an ID
// (docs/architecture.md, "The IPv4 ID").
std::optional<uint16_t> ipv4_id_behind_icrc(uint32_t icrc_id0, uint32_t received, std::size_t udp_payload_size);

// The ICRC's four wire bytes, least significant first.
void store_icrc(uint32_t icrc, std::span<uint8_t, kIcrcSize> out);
uint32_t load_icrc(std::span<const uint8_t, kIcrcSize> in);

}  // namespace softhca::wire
