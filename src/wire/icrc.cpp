#include "wire/icrc.hpp"

#include <algorithm>
#include <array>

#include "wire/crc32.hpp"
#include "wire/ip_udp.hpp"

namespace softhca::wire {
namespace {

constexpr std::size_t kMaskedLrhSize = 8;
constexpr std::size_t kBthVariantByte = 4;  // FECN, BECN, reserved

// Sets the fields the ICRC does not cover to all ones in a copy of the
// headers; `image` holds exactly the IP and UDP headers.
void mask_variant_fields(IpVersion version, std::span<uint8_t> image) {
  uint8_t* ip = image.data();
  std::size_t udp_offset;
  if (version == IpVersion::kV4) {
    ip[1] = 0xFF;                 // TOS
    ip[8] = 0xFF;                 // TTL
    ip[10] = ip[11] = 0xFF;       // header checksum
    udp_offset = kIpv4HeaderSize;
  } else {
    ip[0] |= 0x0F;                // traffic class, high nibble
    ip[1] = ip[2] = ip[3] = 0xFF; // traffic class, low nibble, and flow label
    ip[7] = 0xFF;                 // hop limit
    udp_offset = kIpv6HeaderSize;
  }
  ip[udp_offset + 6] = ip[udp_offset + 7] = 0xFF;  // UDP checksum
}

}  // namespace

Result<uint32_t> icrc_of(std::span<const uint8_t> ip_udp_headers, std::span<const uint8_t> udp_payload) {
  if (udp_payload.size() < kBthSize + kIcrcSize) return fail(std::errc::invalid_argument);
  const auto version = check_ip_udp_headers(ip_udp_headers, udp_payload.size());
  if (!version) return fail(version.error());

  // One masked image of everything up to the end of the BTH, so that the
  // variant fields are covered as ones without touching the caller's bytes.
  std::array<uint8_t, kMaskedLrhSize + kIpv6HeaderSize + kUdpHeaderSize + kBthSize> image;
  std::fill_n(image.begin(), kMaskedLrhSize, uint8_t{0xFF});
  std::copy(ip_udp_headers.begin(), ip_udp_headers.end(), image.begin() + kMaskedLrhSize);
  mask_variant_fields(*version, std::span(image).subspan(kMaskedLrhSize, ip_udp_headers.size()));
  const std::size_t bth_offset = kMaskedLrhSize + ip_udp_headers.size();
  std::copy_n(udp_payload.begin(), kBthSize, image.begin() + bth_offset);
  image[bth_offset + kBthVariantByte] = 0xFF;

  uint32_t crc = crc32_update(0, std::span<const uint8_t>(image).first(bth_offset + kBthSize));
  return crc32_update(crc, udp_payload.subspan(kBthSize, udp_payload.size() - kBthSize - kIcrcSize));
}

Result<uint32_t> icrc_of(std::span<const uint8_t> ip_packet) {
  const auto view = split_ip_udp(ip_packet);
  if (!view) return fail(view.error());
  return icrc_of(view->headers, view->udp_payload);
}

void store_icrc(uint32_t icrc, std::span<uint8_t, kIcrcSize> out) {
  for (std::size_t i = 0; i < kIcrcSize; ++i) out[i] = static_cast<uint8_t>(icrc >> (8 * i));
}

uint32_t load_icrc(std::span<const uint8_t, kIcrcSize> in) {
  uint32_t v = 0;
  for (std::size_t i = 0; i < kIcrcSize; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace softhca::wire
