// Network byte order for the wire codecs. Every header field of IBTA, IP and
// UDP is big-endian and most are not aligned inside the packet, so the codecs
// go byte by byte through these helpers instead of casting structs onto the
// buffer (which would be UB on misaligned data and wrong on a little-endian
// host). Callers check the buffer length first; these only read or write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softhca::wire {

// Reads `Bytes` bytes at `p` as one big-endian unsigned value.
template <std::size_t Bytes>
constexpr uint64_t load_be(const uint8_t* p) {
  static_assert(Bytes >= 1 && Bytes <= 8);
  uint64_t v = 0;
  for (std::size_t i = 0; i < Bytes; ++i) v = (v << 8) | p[i];
  return v;
}

// Writes the low `Bytes` bytes of `v` at `p`, most significant first.
template <std::size_t Bytes>
constexpr void store_be(uint8_t* p, uint64_t v) {
  static_assert(Bytes >= 1 && Bytes <= 8);
  for (std::size_t i = 0; i < Bytes; ++i) p[Bytes - 1 - i] = static_cast<uint8_t>(v >> (8 * i));
}

constexpr uint16_t load_be16(const uint8_t* p) { return static_cast<uint16_t>(load_be<2>(p)); }
constexpr uint32_t load_be24(const uint8_t* p) { return static_cast<uint32_t>(load_be<3>(p)); }
constexpr uint32_t load_be32(const uint8_t* p) { return static_cast<uint32_t>(load_be<4>(p)); }
constexpr uint64_t load_be64(const uint8_t* p) { return load_be<8>(p); }

constexpr void store_be16(uint8_t* p, uint16_t v) { store_be<2>(p, v); }
constexpr void store_be24(uint8_t* p, uint32_t v) { store_be<3>(p, v); }
constexpr void store_be32(uint8_t* p, uint32_t v) { store_be<4>(p, v); }
constexpr void store_be64(uint8_t* p, uint64_t v) { store_be<8>(p, v); }

}  // namespace softhca::wire
