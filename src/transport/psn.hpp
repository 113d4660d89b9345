// Packet sequence numbers: 24 bits that wrap (IBTA 9.7.1). Comparisons are
// on the circle: a PSN is "after" another when it is less than 2^23 ahead.
#pragma once

#include <cstdint>

namespace softhca::transport {

inline constexpr uint32_t kPsnMask = 0xFF'FFFF;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// a - b on the 24-bit circle, in [-2^23, 2^23).
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>((a - b) << 8)) >> 8;
}

// How many packets a message of `length` bytes takes at `mtu` (at least one).
constexpr uint32_t packets_for(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : static_cast<uint32_t>((length + mtu - 1) / mtu);
}

}  // namespace softhca::transport
