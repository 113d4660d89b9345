#include "link/udp/management_port.hpp"

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

}  // namespace softhca::udp
