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
    ip[1] = 0xFF;            // TOS
    ip[8] = 0xFF;            // TTL
    ip[10] = ip[11] = 0xFF;  // header checksum
    udp_offset = kIpv4HeaderSize;
  } else {
    ip[0] |= 0x0F;                 // traffic class, high nibble
    ip[1] = ip[2] = ip[3] = 0xFF;  // traffic class, low nibble, and flow label
    ip[7] = 0xFF;                  // hop limit
    udp_offset = kIpv6HeaderSize;
  }
  ip[udp_offset + 6] = ip[udp_offset + 7] = 0xFF;  // UDP checksum
}

// CRC-32 arithmetic without the initial value and final xor, which cancel
// in the difference of two CRCs of equal-length data. Polynomials mod P are
// held reflected, as the CRC's register is: bit 31 is x^0, bit 0 x^31.
constexpr uint32_t kReflectedPoly = 0xEDB88320;

// a * x mod P.
constexpr uint32_t times_x(uint32_t a) { return (a >> 1) ^ ((a & 1) ? kReflectedPoly : 0); }

// a * b mod P: b times each power of x that a holds, lowest (bit 31) first.
constexpr uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 0x80000000; bit != 0 && a != 0; bit >>= 1) {
    if (a & bit) {
      product ^= b;
      a ^= bit;
    }
    b = times_x(b);
  }
  return product;
}

// x^(8 * 2^k) mod P for k = 0..19: running the register over 2^k zero bytes.
// 2^20 bytes is past any datagram's length.
constexpr std::array<uint32_t, 20> kZeroBytePowers = [] {
  std::array<uint32_t, 20> powers{};
  powers[0] = 0x80000000 >> 8;  // x^8
  for (std::size_t k = 1; k < powers.size(); ++k) powers[k] = multiply(powers[k - 1], powers[k - 1]);
  return powers;
}();

// x^(8 n) mod P: what running the register over n zero bytes multiplies it by.
uint32_t zero_bytes_factor(std::size_t n) {
  uint32_t factor = 0x80000000;  // x^0
  for (std::size_t k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) factor = multiply(factor, kZeroBytePowers[k]);
  }
  return factor;
}

// The register after `bytes`, from zero.
uint32_t register_after(std::span<const uint8_t> bytes) {
  uint32_t r = 0;
  for (uint8_t b : bytes) {
    r ^= b;
    for (int i = 0; i < 8; ++i) r = times_x(r);
  }
  return r;
}

// How many bytes the ICRC covers after the IPv4 ID's low byte: the rest of
// the IP header (14) and the UDP header (8), then the UDP payload but its
// ICRC. (The masked LRH and the first five IP bytes come before.)
constexpr std::size_t bytes_after_id(std::size_t udp_payload_size) {
  return kIpv4HeaderSize - 6 + kUdpHeaderSize + udp_payload_size - kIcrcSize;
}

// x^-1 mod P: the value that times_x takes to x^0 (bit 31). P has an x^0
// term, so x is invertible and so is every power of it.
constexpr uint32_t kInverseX = 0xDB710641;
static_assert(times_x(kInverseX) == 0x80000000);

// x^(-8 * 2^k) mod P for k = 0..19: undoing 2^k zero bytes.
constexpr std::array<uint32_t, 20> kInverseZeroBytePowers = [] {
  std::array<uint32_t, 20> powers{};
  uint32_t inverse_x8 = 0x80000000;
  for (int i = 0; i < 8; ++i) inverse_x8 = multiply(inverse_x8, kInverseX);
  powers[0] = inverse_x8;
  for (std::size_t k = 1; k < powers.size(); ++k) powers[k] = multiply(powers[k - 1], powers[k - 1]);
  return powers;
}();
static_assert(multiply(kInverseZeroBytePowers[3], kZeroBytePowers[3]) == 0x80000000);

// x^(-8 n) mod P.
uint32_t inverse_zero_bytes_factor(std::size_t n) {
  uint32_t factor = 0x80000000;
  for (std::size_t k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) factor = multiply(factor, kInverseZeroBytePowers[k]);
  }
  return factor;
}

// What an ID does to the ICRC at one packet length. The difference for ID
// bytes (b0, b1) is W * x^(16 + 8 n), where W = b0 | b1 << 8 is the pair as
// the reflected register holds it and n the bytes after the ID: the
// register runs over the two ID bytes, then over n zeros. `bit` holds the
// differences of IDs 1, 2, 4, ..., 128 (an ID below 256 differs from 0 in
// its low byte only, so its difference is the xor of those of its bits:
// the sender's GSO segments); `undo` is x^-(16 + 8 n), which takes any
// difference back to its W. Computing them costs a few dozen
// multiplications, so each thread keeps those of the lengths it saw last:
// a flow's packets come in very few lengths (the MTU's, a last one).
// `undo_nibble[k][v]` is multiply(v << (28 - 4 k), undo): multiplying is
// linear in the first factor, so a difference times undo is the xor of its
// eight nibbles' entries, a tenth of the bit-serial multiply's time. A
// receiver solves an ID for every GSO segment a softhca peer sends (each
// segment's ICRC is computed for the ID the kernel gives it): the
// bit-serial multiply took a tenth of the receiving thread between hosts.
struct IdBasis {
  std::size_t udp_payload_size = 0;  // 0: empty (no packet is that short)
  std::array<uint32_t, 8> bit{};
  uint32_t undo = 0;
  std::array<std::array<uint32_t, 16>, 8> undo_nibble{};
  uint32_t times_undo(uint32_t difference) const {
    uint32_t w = 0;
    for (std::size_t k = 0; k < undo_nibble.size(); ++k) w ^= undo_nibble[k][(difference >> (28 - 4 * k)) & 15];
    return w;
  }
};

const IdBasis& id_basis(std::size_t udp_payload_size) {
  thread_local std::array<IdBasis, 16> cache{};
  IdBasis& entry = cache[(udp_payload_size ^ (udp_payload_size >> 4)) & 15];
  if (entry.udp_payload_size != udp_payload_size) {
    const std::size_t n = bytes_after_id(udp_payload_size);
    const uint32_t factor = zero_bytes_factor(n);
    for (std::size_t b = 0; b < entry.bit.size(); ++b) {
      const uint8_t low = static_cast<uint8_t>(1U << b);
      entry.bit[b] = multiply(register_after(std::span<const uint8_t>(&low, 1)), factor);
    }
    entry.undo = multiply(inverse_zero_bytes_factor(n),
                          kInverseZeroBytePowers[1]);  // and the ID's own two bytes
    // x^i * undo for each bit i of the difference (bit 31 - i in the
    // reflected register), one times_x from the last; a nibble's entries
    // are the xors of its four bits'.
    std::array<uint32_t, 32> single{};
    single[0] = entry.undo;
    for (std::size_t i = 1; i < single.size(); ++i) single[i] = times_x(single[i - 1]);
    for (std::size_t k = 0; k < entry.undo_nibble.size(); ++k) {
      for (uint32_t v = 0; v < 16; ++v) {
        uint32_t w = 0;
        for (uint32_t b = 0; b < 4; ++b)
          if (v & (8U >> b)) w ^= single[4 * k + b];
        entry.undo_nibble[k][v] = w;
      }
    }
    entry.udp_payload_size = udp_payload_size;
  }
  return entry;
}

}  // namespace

uint32_t icrc_ipv4_id_delta(uint16_t ip_id, std::size_t udp_payload_size) {
  if (ip_id == 0) return 0;
  if (ip_id < 256) {
    const IdBasis& basis = id_basis(udp_payload_size);
    uint32_t delta = 0;
    for (std::size_t b = 0; b < basis.bit.size(); ++b) {
      if (ip_id & (1U << b)) delta ^= basis.bit[b];
    }
    return delta;
  }
  // Both ID bytes, big-endian as on the wire, then the zeros after them.
  const uint8_t id_bytes[2] = {static_cast<uint8_t>(ip_id >> 8), static_cast<uint8_t>(ip_id)};
  return multiply(register_after(id_bytes), zero_bytes_factor(bytes_after_id(udp_payload_size)));
}

std::optional<uint16_t> ipv4_id_behind_icrc(uint32_t icrc_id0, uint32_t received, std::size_t udp_payload_size) {
  const uint32_t difference = icrc_id0 ^ received;
  if (difference == 0) return std::nullopt;
  // Multiplying by a power of x is one-to-one, so exactly one 32-bit W has
  // this difference; it is an ID's when it fits the two ID bytes, which
  // 65,535 of the 2^32 - 1 nonzero differences do.
  const uint32_t w = id_basis(udp_payload_size).times_undo(difference);
  if (w > 0xFFFF) return std::nullopt;
  return static_cast<uint16_t>((w & 0xFF) << 8 | w >> 8);  // b0 is the ID's high byte
}

Result<IcrcPrefix> icrc_prefix(std::span<const uint8_t> ip_udp_headers, std::size_t udp_payload_size) {
  const auto version = check_ip_udp_headers(ip_udp_headers, udp_payload_size);
  if (!version) return fail(version.error());
  // The masked image of the pseudo-LRH (ones) and the IP and UDP headers,
  // the variant fields covered as ones without touching the caller's bytes.
  std::array<uint8_t, kMaskedLrhSize + kIpv6HeaderSize + kUdpHeaderSize> image;
  std::fill_n(image.begin(), kMaskedLrhSize, uint8_t{0xFF});
  std::copy(ip_udp_headers.begin(), ip_udp_headers.end(), image.begin() + kMaskedLrhSize);
  mask_variant_fields(*version, std::span(image).subspan(kMaskedLrhSize, ip_udp_headers.size()));
  IcrcPrefix prefix;
  prefix.crc = crc32_update(0, std::span<const uint8_t>(image).first(kMaskedLrhSize + ip_udp_headers.size()));
  prefix.udp_payload_size = udp_payload_size;
  prefix.ipv4_id0 = *version == IpVersion::kV4 && ip_udp_headers[4] == 0 && ip_udp_headers[5] == 0;
  return prefix;
}

uint32_t icrc_after_prefix(const IcrcPrefix& prefix, std::span<const uint8_t> udp_payload) {
  std::array<uint8_t, kBthSize> bth;
  std::copy_n(udp_payload.begin(), kBthSize, bth.begin());
  bth[kBthVariantByte] = 0xFF;
  const uint32_t crc = crc32_update(prefix.crc, bth);
  return crc32_update(crc, udp_payload.subspan(kBthSize, udp_payload.size() - kBthSize - kIcrcSize));
}

Result<uint32_t> icrc_of(std::span<const uint8_t> ip_udp_headers, std::span<const uint8_t> udp_payload) {
  if (udp_payload.size() < kBthSize + kIcrcSize) return fail(std::errc::invalid_argument);
  const auto prefix = icrc_prefix(ip_udp_headers, udp_payload.size());
  if (!prefix) return fail(prefix.error());
  return icrc_after_prefix(*prefix, udp_payload);
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
