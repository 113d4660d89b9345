#include "wire/packet.hpp"

#include <algorithm>

#include "wire/icrc.hpp"

namespace softhca::wire {
namespace {

// Walks the extended headers of a buffer whose length the caller has already
// checked against the opcode's header size, so each take() is in bounds.
class HeaderReader {
 public:
  explicit HeaderReader(std::span<const uint8_t> headers) : rest_(headers) {}
  template <std::size_t N>
  std::span<const uint8_t, N> take() {
    const auto s = rest_.first<N>();
    rest_ = rest_.subspan(N);
    return s;
  }

 private:
  std::span<const uint8_t> rest_;
};

class HeaderWriter {
 public:
  explicit HeaderWriter(std::span<uint8_t> headers) : rest_(headers) {}
  template <std::size_t N>
  std::span<uint8_t, N> take() {
    const auto s = rest_.first<N>();
    rest_ = rest_.subspan(N);
    return s;
  }

 private:
  std::span<uint8_t> rest_;
};

// The wire's narrow fields, checked before encoding so that masking in the
// header codecs never silently changes a value.
bool fields_in_range(const Headers& h) {
  if (h.bth.tver > 0xF || h.bth.dest_qpn > kMax24 || h.bth.psn > kMax24) return false;
  if (h.aeth && h.aeth->msn > kMax24) return false;
  if (h.deth && h.deth->src_qpn > kMax24) return false;
  if (h.xrceth && h.xrceth->srqn > kMax24) return false;
  return true;
}

constexpr std::size_t pad_for(std::size_t payload_size) { return (4 - payload_size % 4) % 4; }

}  // namespace

ExtHeaders present_headers(const Headers& h) {
  return ExtHeaders{.deth = h.deth.has_value(),
                    .xrceth = h.xrceth.has_value(),
                    .reth = h.reth.has_value(),
                    .atomic_eth = h.atomic_eth.has_value(),
                    .aeth = h.aeth.has_value(),
                    .atomic_ack_eth = h.atomic_ack_eth.has_value(),
                    .immdt = h.immdt.has_value(),
                    .ieth = h.ieth.has_value()};
}

std::string_view to_string(ParseError e) {
  switch (e) {
    case ParseError::kBadIpUdpHeader: return "bad_ip_udp_header";
    case ParseError::kNotRoceV2: return "not_rocev2";
    case ParseError::kTruncated: return "truncated";
    case ParseError::kBadIcrc: return "bad_icrc";
    case ParseError::kBadTransportVersion: return "bad_transport_version";
    case ParseError::kUnknownOpcode: return "unknown_opcode";
    case ParseError::kUnalignedLength: return "unaligned_length";
    case ParseError::kBadPadCount: return "bad_pad_count";
    case ParseError::kUnexpectedPayload: return "unexpected_payload";
    case ParseError::kBadPayloadLength: return "bad_payload_length";
    case ParseError::kPayloadTooLong: return "payload_too_long";
  }
  return "unknown_parse_error";
}

std::expected<ParsedPacket, ParseError> parse(std::span<const uint8_t> ip_udp_headers,
                                              std::span<const uint8_t> udp_payload, const ParseLimits& limits) {
  if (udp_payload.size() < kBthSize + kIcrcSize) return std::unexpected(ParseError::kTruncated);
  const auto prefix = icrc_prefix(ip_udp_headers, udp_payload.size());
  if (!prefix) return std::unexpected(ParseError::kBadIpUdpHeader);
  return parse(*prefix, udp_payload, limits);
}

std::expected<ParsedPacket, ParseError> parse(const IcrcPrefix& prefix, std::span<const uint8_t> udp_payload,
                                              const ParseLimits& limits) {
  using E = ParseError;
  if (udp_payload.size() < kBthSize + kIcrcSize) return std::unexpected(E::kTruncated);
  if (udp_payload.size() != prefix.udp_payload_size) return std::unexpected(E::kBadIpUdpHeader);
  const uint32_t icrc = icrc_after_prefix(prefix, udp_payload);
  const uint32_t received = load_icrc(udp_payload.last<kIcrcSize>());
  uint16_t unseen_ipv4_id = 0;
  if (icrc != received) {
    // A receiver that rebuilt an ID-0 IPv4 image accepts the ICRC of the
    // real ID it could not see (icrc.hpp).
    const auto id = prefix.ipv4_id0 && limits.ipv4_id_unseen ? ipv4_id_behind_icrc(icrc, received, udp_payload.size())
                                                             : std::nullopt;
    if (!id) return std::unexpected(E::kBadIcrc);
    unseen_ipv4_id = *id;
  }

  const Bth bth = decode_bth(udp_payload.first<kBthSize>());
  // IBTA: a packet of an unknown transport version is silently dropped.
  if (bth.tver != kTransportVersion) return std::unexpected(E::kBadTransportVersion);
  const auto info = opcode_info(bth.opcode);
  if (!info) return std::unexpected(E::kUnknownOpcode);
  if (udp_payload.size() < info->header_size + kIcrcSize) return std::unexpected(E::kTruncated);

  // Payload and pad: everything between the headers and the ICRC.
  const std::size_t after_headers = udp_payload.size() - info->header_size - kIcrcSize;
  if (after_headers % 4 != 0) return std::unexpected(E::kUnalignedLength);
  if (bth.pad_count > after_headers) return std::unexpected(E::kBadPadCount);
  const std::size_t payload_size = after_headers - bth.pad_count;
  switch (info->payload) {
    case PayloadRule::kNone:
      if (after_headers != 0) return std::unexpected(E::kUnexpectedPayload);
      break;
    case PayloadRule::kAtomicValue:
      if (payload_size != 8) return std::unexpected(E::kBadPayloadLength);
      break;
    case PayloadRule::kData:
      if (payload_size > limits.max_payload) return std::unexpected(E::kPayloadTooLong);
      break;
  }

  ParsedPacket p{.info = *info,
                 .headers = {.bth = bth},
                 .payload = udp_payload.subspan(info->header_size, payload_size),
                 .unseen_ipv4_id = unseen_ipv4_id};
  HeaderReader r(udp_payload.subspan(kBthSize, info->header_size - kBthSize));
  const ExtHeaders& ext = info->headers;
  if (ext.deth) p.headers.deth = decode_deth(r.take<kDethSize>());
  if (ext.xrceth) p.headers.xrceth = decode_xrceth(r.take<kXrcethSize>());
  if (ext.reth) p.headers.reth = decode_reth(r.take<kRethSize>());
  if (ext.atomic_eth) p.headers.atomic_eth = decode_atomic_eth(r.take<kAtomicEthSize>());
  if (ext.aeth) p.headers.aeth = decode_aeth(r.take<kAethSize>());
  if (ext.atomic_ack_eth) p.headers.atomic_ack_eth = decode_atomic_ack_eth(r.take<kAtomicAckEthSize>());
  if (ext.immdt) p.headers.immdt = decode_immdt(r.take<kImmDtSize>());
  if (ext.ieth) p.headers.ieth = decode_ieth(r.take<kIethSize>());
  return p;
}

std::expected<ParsedPacket, ParseError> parse_ip_packet(std::span<const uint8_t> ip_packet, const ParseLimits& limits) {
  const auto view = split_ip_udp(ip_packet);
  if (!view) return std::unexpected(ParseError::kBadIpUdpHeader);
  if (view->dst_port != kRoceV2Port) return std::unexpected(ParseError::kNotRoceV2);
  return parse(view->headers, view->udp_payload, limits);
}

Result<std::size_t> encode_around_payload(const Headers& h, std::size_t payload_size, const IcrcPrefix& prefix,
                                          std::span<uint8_t> out) {
  const auto info = opcode_info(h.bth.opcode);
  if (!info) return fail(std::errc::invalid_argument);
  if (present_headers(h) != info->headers || !fields_in_range(h)) return fail(std::errc::invalid_argument);
  if (info->payload == PayloadRule::kNone && payload_size != 0) return fail(std::errc::invalid_argument);
  if (info->payload == PayloadRule::kAtomicValue && payload_size != 8) return fail(std::errc::invalid_argument);
  const std::size_t size = encoded_size(*info, payload_size);
  // The headers must describe this very packet, or the ICRC would cover a
  // packet other than the one sent.
  if (prefix.udp_payload_size != size) return fail(std::errc::invalid_argument);
  if (out.size() < size) return fail(std::errc::no_buffer_space);

  Bth bth = h.bth;
  bth.pad_count = static_cast<uint8_t>(pad_for(payload_size));
  encode_bth(bth, out.first<kBthSize>());
  HeaderWriter w(out.subspan(kBthSize, info->header_size - kBthSize));
  if (h.deth) encode_deth(*h.deth, w.take<kDethSize>());
  if (h.xrceth) encode_xrceth(*h.xrceth, w.take<kXrcethSize>());
  if (h.reth) encode_reth(*h.reth, w.take<kRethSize>());
  if (h.atomic_eth) encode_atomic_eth(*h.atomic_eth, w.take<kAtomicEthSize>());
  if (h.aeth) encode_aeth(*h.aeth, w.take<kAethSize>());
  if (h.atomic_ack_eth) encode_atomic_ack_eth(*h.atomic_ack_eth, w.take<kAtomicAckEthSize>());
  if (h.immdt) encode_immdt(*h.immdt, w.take<kImmDtSize>());
  if (h.ieth) encode_ieth(*h.ieth, w.take<kIethSize>());
  // Pad bytes are zero (IBTA) and covered by the ICRC.
  std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(info->header_size + payload_size), bth.pad_count, uint8_t{0});

  const auto packet = out.first(size);
  store_icrc(icrc_after_prefix(prefix, packet), packet.last<kIcrcSize>());
  return size;
}

Result<std::size_t> encode_around_payload(const Headers& h, std::size_t payload_size,
                                          std::span<const uint8_t> ip_udp_headers, std::span<uint8_t> out) {
  const auto info = opcode_info(h.bth.opcode);
  if (!info) return fail(std::errc::invalid_argument);
  const auto prefix = icrc_prefix(ip_udp_headers, encoded_size(*info, payload_size));
  if (!prefix) return fail(std::errc::invalid_argument);
  return encode_around_payload(h, payload_size, *prefix, out);
}

Result<std::size_t> encode(const Headers& h, std::span<const uint8_t> payload, std::span<const uint8_t> ip_udp_headers,
                           std::span<uint8_t> out) {
  const auto info = opcode_info(h.bth.opcode);
  if (!info) return fail(std::errc::invalid_argument);
  if (out.size() < encoded_size(*info, payload.size())) return fail(std::errc::no_buffer_space);
  std::copy(payload.begin(), payload.end(), out.begin() + static_cast<std::ptrdiff_t>(info->header_size));
  return encode_around_payload(h, payload.size(), ip_udp_headers, out);
}

Result<std::size_t> encode_ip_packet(const UdpFlow& flow, const Headers& h, std::span<const uint8_t> payload,
                                     std::span<uint8_t> out) {
  const auto info = opcode_info(h.bth.opcode);
  if (!info) return fail(std::errc::invalid_argument);
  const std::size_t udp_payload_size = encoded_size(*info, payload.size());
  const auto header_size = write_ip_udp_headers(flow, udp_payload_size, out);
  if (!header_size) return fail(header_size.error());
  const auto packet_size = encode(h, payload, out.first(*header_size), out.subspan(*header_size));
  if (!packet_size) return fail(packet_size.error());
  const std::size_t total = *header_size + *packet_size;
  if (const auto ok = fill_udp_checksum(out.first(total)); !ok) return fail(ok.error());
  return total;
}

}  // namespace softhca::wire
