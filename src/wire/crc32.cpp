#include "wire/crc32.hpp"

#include <isa-l/crc.h>

#include <algorithm>

namespace softhca::wire {

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data) {
  // crc32_gzip_refl takes a uint64_t length; the spans here are one UDP
  // datagram at most, but chunking keeps any span correct.
  while (!data.empty()) {
    const std::size_t n = std::min<std::size_t>(data.size(), std::size_t{1} << 30);
    crc = crc32_gzip_refl(crc, data.data(), n);
    data = data.subspan(n);
  }
  return crc;
}

}  // namespace softhca::wire
