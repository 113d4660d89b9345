// Whole IBA transport packets as RoCEv2 carries them in a UDP payload:
//   BTH | extended headers (as the opcode table says) | payload | pad | ICRC
//
// encode() lays one out in a caller buffer; parse() turns a received one
// into a view of its headers and payload. parse() reads nothing it has not
// bounds-checked and returns every defect as a ParseError value, one per
// reason, so that the link can count drops by reason; it never trusts a
// length or pad count from the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string_view>

#include "common/result.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/ip_udp.hpp"
#include "wire/opcode.hpp"

namespace softhca::wire {

// The largest payload of one packet: the largest IBTA path MTU.
inline constexpr std::size_t kMaxPayload = 4096;

// A packet's transport headers. Exactly the extended headers that the BTH's
// opcode calls for are present (opcode.hpp).
struct Headers {
  Bth bth;
  std::optional<Deth> deth;
  std::optional<Xrceth> xrceth;
  std::optional<Reth> reth;
  std::optional<AtomicEth> atomic_eth;
  std::optional<Aeth> aeth;
  std::optional<AtomicAckEth> atomic_ack_eth;
  std::optional<ImmDt> immdt;
  std::optional<Ieth> ieth;
  friend bool operator==(const Headers&, const Headers&) = default;
};

// Which extended headers `h` holds, to compare with OpcodeInfo::headers.
ExtHeaders present_headers(const Headers& h);

struct ParsedPacket {
  OpcodeInfo info;                   // the opcode's table entry
  Headers headers;
  std::span<const uint8_t> payload;  // in the caller's buffer; pad and ICRC excluded
  // The IPv4 ID the ICRC matched beyond the header image's (0 but for a
  // packet accepted through ParseLimits::ipv4_id_unseen).
  uint16_t unseen_ipv4_id = 0;
};

// Why a packet was dropped. Checked in this order, so each packet has one
// reason: the ICRC first (a corrupted packet is reported as corrupted, not by
// whichever field the corruption hit), then the fields it vouches for.
enum class ParseError : uint8_t {
  kBadIpUdpHeader,       // not IPv4/IPv6 + UDP of the supported form, or lengths that disagree
  kNotRoceV2,            // UDP destination port is not 4791 (parse_ip_packet only)
  kTruncated,            // shorter than a BTH and an ICRC, or than its opcode's headers
  kBadIcrc,              // the ICRC does not match: corrupted on the way
  kBadTransportVersion,  // BTH TVer is not 0
  kUnknownOpcode,        // not RC, UC, UD or XRC, or reserved (opcode.hpp)
  kUnalignedLength,      // payload and pad do not make a multiple of four bytes
  kBadPadCount,          // more pad than bytes after the headers
  kUnexpectedPayload,    // data after the headers of an opcode that carries none
  kBadPayloadLength,     // an ATOMIC WRITE whose value is not eight bytes
  kPayloadTooLong,       // more than ParseLimits::max_payload
};
inline constexpr std::size_t kParseErrorCount = 11;
static_assert(static_cast<std::size_t>(ParseError::kPayloadTooLong) + 1 == kParseErrorCount);

// A short lowercase name for logs and counters, e.g. "bad_icrc".
std::string_view to_string(ParseError e);

struct ParseLimits {
  std::size_t max_payload = kMaxPayload;  // the receiver's path MTU
  // With an IPv4 header image whose ID is 0 (a receiver that cannot see the
  // real ID, as a UDP socket's), also accept the ICRC of any other ID
  // (ipv4_id_behind_icrc) and report it in ParsedPacket::unseen_ipv4_id:
  // a GSO send's segments carry the IDs 1, 2, ..., other senders (rxe, NICs)
  // whatever their kernel or hardware counts. false: the ICRC must match
  // the image exactly, as for a capture, whose headers are the real ones.
  bool ipv4_id_unseen = false;
};

// Parses a UDP payload received with the IP and UDP headers `ip_udp_headers`
// (the receiver's rebuilt image, see ip_udp.hpp; only used for the ICRC).
std::expected<ParsedPacket, ParseError> parse(std::span<const uint8_t> ip_udp_headers,
                                              std::span<const uint8_t> udp_payload, const ParseLimits& limits = {});
// The same with the headers' part of the ICRC computed before (icrc_prefix,
// for prefix.udp_payload_size bytes; a payload of another size is
// kBadIpUdpHeader, as headers that do not describe it are).
std::expected<ParsedPacket, ParseError> parse(const IcrcPrefix& prefix, std::span<const uint8_t> udp_payload,
                                              const ParseLimits& limits = {});

// Parses a whole IP packet, as a capture holds it.
std::expected<ParsedPacket, ParseError> parse_ip_packet(std::span<const uint8_t> ip_packet,
                                                        const ParseLimits& limits = {});

// The UDP payload size of a packet of `info` with `payload_size` data bytes:
// headers, payload, pad and ICRC.
constexpr std::size_t encoded_size(const OpcodeInfo& info, std::size_t payload_size) {
  return info.header_size + payload_size + ((4 - payload_size % 4) % 4) + kIcrcSize;
}

// Writes the UDP payload of one packet into `out` and returns its size. The
// pad count is derived from the payload size (h.bth.pad_count is ignored) and
// the ICRC is computed over `ip_udp_headers`, which must already describe a
// UDP payload of the returned size (write_ip_udp_headers with encoded_size).
// invalid_argument for an unknown opcode, extended headers that differ from
// the opcode's, a payload the opcode does not allow, a field out of its range
// or headers that do not fit; no_buffer_space when `out` is too small.
Result<std::size_t> encode(const Headers& h, std::span<const uint8_t> payload, std::span<const uint8_t> ip_udp_headers,
                           std::span<uint8_t> out);

// encode() for a payload the caller already put in place, at
// out[header_size, header_size + payload_size) of the opcode's OpcodeInfo:
// writes the headers before it and the pad and ICRC after it. Saves a copy
// where the payload is gathered from several buffers (a WQE's SGEs).
Result<std::size_t> encode_around_payload(const Headers& h, std::size_t payload_size,
                                          std::span<const uint8_t> ip_udp_headers, std::span<uint8_t> out);
// The same with the ICRC's part over the IP and UDP headers made already
// (icrc_prefix, for this packet's size): what a sender of many packets of
// one flow and size computes once. invalid_argument when the prefix is for
// another size.
Result<std::size_t> encode_around_payload(const Headers& h, std::size_t payload_size, const IcrcPrefix& prefix,
                                          std::span<uint8_t> out);

// Writes a whole IP packet: the flow's IP and UDP headers (UDP checksum
// included) and the packet encode() makes. For captures and tests; the udp
// link sends encode()'s bytes and lets the kernel add the headers.
Result<std::size_t> encode_ip_packet(const UdpFlow& flow, const Headers& h, std::span<const uint8_t> payload,
                                     std::span<uint8_t> out);

}  // namespace softhca::wire
