// What one harness gives fuzz_driver.cpp, the main() that runs a libFuzzer
// harness where libFuzzer is not available (GCC 12 has none). The driver is
// blind (no coverage feedback), so it leans on the harness's knowledge of its
// input format: where its seeds come from, which mutations are worth more
// than a random byte, and what to repair afterwards so that the checks behind
// a length or a checksum are reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace softhca::fuzz {

using Bytes = std::vector<uint8_t>;

// The driver's PRNG: fixed seed, so that input N of a run is always the same.
class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }
  uint8_t byte() { return static_cast<uint8_t>(rng_()); }
  uint64_t next() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

struct Target {
  const char* name;  // in the driver's messages: "<name>_fuzz_driver"
  // The starting corpus (also what --write-seeds writes for libFuzzer).
  std::vector<Bytes> (*seeds)();
  // A mutation that knows the format; the driver mixes it with generic ones.
  void (*tweak)(Bytes& input, Random& random);
  // After the mutations, half of the time: make the input consistent again.
  void (*repair)(Bytes& input);
  // Optional: a fresh input (nullptr: none); the driver draws one now and then.
  Bytes (*generate)(Random& random);
};

// Defined by the harness's *_target.cpp, linked with the driver.
extern const Target kTarget;

}  // namespace softhca::fuzz
