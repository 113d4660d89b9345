// Seeded byte patterns and guarded buffer layouts, computed the same way on
// both hosts: the side that checks bytes needs only a case's seed and sizes,
// never a copy of the data, so a wrong byte cannot be hidden by the same bug
// on the way back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace integrity {

// Every byte of a buffer that no SGE covers holds this; a transfer that
// writes outside its SGEs changes one.
inline constexpr uint8_t kGuard = 0xEE;
inline constexpr size_t kGap = 64;

// splitmix64: a good 64-bit mixer, so nearby seeds give unrelated patterns.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void fill_pattern(std::span<uint8_t> out, uint64_t seed);
std::vector<uint8_t> pattern(size_t n, uint64_t seed);

// Where the SGEs of one message lie: regions separated (and preceded and
// followed) by kGap guard bytes. `total` is the whole span, guards included.
struct Layout {
  std::vector<std::pair<size_t, size_t>> regions;  // offset, length
  size_t total = 0;

  static Layout of(std::initializer_list<size_t> lengths);
};

// Three uneven pieces, cut differently on the two sides so that SGE
// boundaries never line up with each other or with packet boundaries.
Layout gather_layout(size_t n);
// `slack`: room beyond the message in the last SGE (a receive may be larger).
Layout scatter_layout(size_t n, size_t slack);
Layout single_layout(size_t n);
// A UD receive: the 40-byte GRH in an SGE of its own, then a scatter.
Layout ud_layout(size_t n, size_t slack);

// Writes guards over `out` (layout.total bytes) and `message` through the
// regions from `first_region` on, in order.
void place(std::span<uint8_t> out, const Layout& layout, std::span<const uint8_t> message, size_t first_region = 0);

struct Mismatch {
  long first = -1;  // offset of the first wrong byte, -1 when none
  size_t count = 0;
  uint8_t want = 0, got = 0;
  explicit operator bool() const { return first >= 0; }
};
Mismatch compare(std::span<const uint8_t> got, std::span<const uint8_t> want);
// "byte 300 of 1281 wrong (want 0x12, got 0xee); 724 bytes wrong"
std::string describe(const Mismatch& m, size_t size);

}  // namespace integrity
