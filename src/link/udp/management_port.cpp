#include "link/udp/management_port.hpp"

#include <cstring>

#include "link/link.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softhca::udp {

static_assert(kGsiMadBytes == link::kMadBytes);

Result<std::vector<uint8_t>> gsi_datagram(const wire::Gid& src, const wire::Gid& dst, uint16_t src_port, uint32_t psn,
                                          std::span<const uint8_t> mad) {
  wire::Headers h;
  h.bth.opcode = static_cast<uint8_t>(wire::Opcode::kUdSendOnly);
  h.bth.dest_qpn = link::kGsiQpn;
  h.bth.psn = psn & 0xFFFFFF;
  h.deth = wire::Deth{link::kGsiQkey, link::kGsiQpn};
  const auto info = wire::opcode_info(h.bth.opcode);
  if (!info) return fail(std::errc::invalid_argument);
  wire::UdpFlow flow;
  flow.src_gid = src;
  flow.dst_gid = dst;
  flow.src_port = src_port;
  const std::size_t size = wire::encoded_size(*info, mad.size());
  uint8_t image[wire::kIpv6HeaderSize + wire::kUdpHeaderSize];
  const auto n = wire::write_ip_udp_headers(flow, size, image);
  if (!n) return fail(n.error());
  std::vector<uint8_t> out(size);
  const auto encoded = wire::encode(h, mad, std::span<const uint8_t>(image, *n), out);
  if (!encoded) return fail(encoded.error());
  out.resize(*encoded);
  return out;
}

std::optional<ArrivedGsi> parse_gsi_datagram(const Received& from, std::span<const uint8_t> bytes) {
  wire::UdpFlow flow;
  flow.src_gid = from.src;
  flow.dst_gid = from.dst;
  flow.src_port = from.src_port;
  uint8_t image[wire::kIpv6HeaderSize + wire::kUdpHeaderSize];
  const auto n = wire::write_ip_udp_headers(flow, bytes.size(), image);
  if (!n) return std::nullopt;
  // The socket hides the IPv4 ID, which the ICRC covers.
  wire::ParseLimits limits;
  limits.ipv4_id_unseen = true;
  const auto packet = wire::parse(std::span<const uint8_t>(image, *n), bytes, limits);
  if (!packet || packet->headers.bth.opcode != static_cast<uint8_t>(wire::Opcode::kUdSendOnly) ||
      packet->headers.bth.dest_qpn != link::kGsiQpn || !packet->headers.deth ||
      packet->headers.deth->qkey != link::kGsiQkey || packet->payload.size() < kGsiMadBytes)
    return std::nullopt;
  ArrivedGsi out;
  out.src = from.src;
  out.dst = from.dst;
  std::memcpy(out.mad.data(), packet->payload.data(), kGsiMadBytes);
  return out;
}

Result<std::unique_ptr<ManagementSender>> ManagementSender::open() {
  SocketOptions options;
  options.gso = false;
  options.receive = false;
  auto sockets = Sockets::open(options);
  if (!sockets) return fail(sockets.error());
  return std::unique_ptr<ManagementSender>(new ManagementSender(std::move(*sockets)));
}

Result<void> ManagementSender::send(const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad) {
  const uint16_t port = sockets_->source_port(wire::is_ipv4_mapped(dst));
  if (port == 0) return fail(std::errc::address_family_not_supported);
  auto bytes = gsi_datagram(src, dst, port, psn_++, mad);
  if (!bytes) return fail(bytes.error());
  return sockets_->send(src, dst, 0, 64, *bytes);
}

Result<std::unique_ptr<ManagementListener>> ManagementListener::open() {
  SocketOptions options;
  options.gso = false;
  auto sockets = Sockets::open(options);
  if (!sockets) return fail(sockets.error());
  return std::unique_ptr<ManagementListener>(new ManagementListener(std::move(*sockets)));
}

std::vector<ArrivedGsi> ManagementListener::take() {
  std::vector<ArrivedGsi> out;
  // A coalesced run (UDP_GRO) of up to 64 KiB comes as one read.
  std::vector<uint8_t> buffer(65536);
  for (const int fd : fds()) {
    if (fd < 0) continue;
    Received r;
    for (int reads = 0; reads < 256 && sockets_->receive(fd, buffer, r); ++reads) {
      const std::size_t step = r.segment_size != 0 ? r.segment_size : r.length;
      for (std::size_t at = 0; step != 0 && at < r.length; at += step) {
        const std::size_t len = std::min(step, r.length - at);
        if (auto mad = parse_gsi_datagram(r, std::span<const uint8_t>(buffer.data() + at, len))) out.push_back(*mad);
      }
    }
  }
  return out;
}

}  // namespace softhca::udp
