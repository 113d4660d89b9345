// crc32_update (ISA-L) against zlib's crc32, the reference: the same CRC on
// every golden packet, on any length and alignment, and when continued
// across pieces as the ICRC continues it from the masked headers into the
// payload.
#include "wire/crc32.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <span>
#include <vector>

#include "wire_golden/golden_support.hpp"

namespace softhca::wire {
namespace {

uint32_t zlib_crc(uint32_t crc, std::span<const uint8_t> data) {
  return static_cast<uint32_t>(crc32(crc, data.data(), static_cast<uInt>(data.size())));
}

// Bytes from a fixed linear congruential sequence: the same on every run.
std::vector<uint8_t> sample_bytes(std::size_t n) {
  std::vector<uint8_t> bytes(n);
  uint32_t x = 12345;
  for (auto& b : bytes) {
    x = x * 1103515245U + 12345U;
    b = static_cast<uint8_t>(x >> 16);
  }
  return bytes;
}

TEST(WireCrc32, MatchesZlibOnEveryGoldenPacket) {
  for (const auto& p : golden::kPackets) {
    EXPECT_EQ(crc32_update(0, p.ip_packet), zlib_crc(0, p.ip_packet)) << p.name;
  }
}

TEST(WireCrc32, MatchesZlibOnEveryLengthAndAlignment) {
  const auto bytes = sample_bytes(4096 + 64 + 16);
  for (std::size_t offset = 0; offset < 16; ++offset) {
    for (std::size_t length = 0; length <= 4096 + 64; ++length) {
      const auto piece = std::span<const uint8_t>(bytes).subspan(offset, length);
      ASSERT_EQ(crc32_update(0, piece), zlib_crc(0, piece)) << "offset " << offset << " length " << length;
    }
  }
}

TEST(WireCrc32, ContinuesAcrossPiecesAsZlibDoes) {
  const auto bytes = sample_bytes(1100);
  const std::span<const uint8_t> all(bytes);
  const uint32_t whole = zlib_crc(0, all);
  for (std::size_t cut : {0, 1, 8, 36, 48, 64, 1023, 1100}) {
    const uint32_t first = crc32_update(0, all.first(cut));
    EXPECT_EQ(first, zlib_crc(0, all.first(cut)));
    EXPECT_EQ(crc32_update(first, all.subspan(cut)), whole) << "cut at " << cut;
  }
}

TEST(WireCrc32, KnownCheckValue) {
  // The CRC-32 catalogue's check value: the CRC of the ASCII digits 1-9.
  const uint8_t digits[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(crc32_update(0, digits), 0xCBF43926U);
}

}  // namespace
}  // namespace softhca::wire
