// Bits from the kernel's random source, for the identifiers a stranger on
// the network must not be able to predict from the ones it has seen (memory
// keys, QPNs: docs/architecture.md, "Threat model"). Not for anything on a
// data path: each call is a system call.
#pragma once

#include <cstdint>

namespace softhca {

// 64 bits from getrandom(2) (the urandom pool; it blocks only before the
// pool was ever seeded, early in boot).
uint64_t system_random_u64();

}  // namespace softhca
