// The CRC-32 of Ethernet, gzip and zlib (reflected, polynomial 0x04C11DB7,
// initial value and final xor all ones), which the RoCEv2 ICRC is. Computed
// by ISA-L's crc32_gzip_refl, which folds with carry-less multiplication
// where the CPU has it: several times faster than zlib's table-driven crc32
// on packet-sized buffers, and the ICRC is computed twice per packet (once
// by the sender, once by the receiver). zlib's crc32 stays the reference in
// the unit tests.
#pragma once

#include <cstdint>
#include <span>

namespace softhca::wire {

// The CRC of `data` continued from `crc`, the CRC of the bytes before it (0
// for none), with the same chaining rule as zlib's crc32(crc, data, size).
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data);

}  // namespace softhca::wire
