#include "transport/ibta_timers.hpp"

namespace softhca::transport {

uint64_t rnr_timer_ns(uint32_t code) {
  // IBTA table 45, in units of 10 us; code 0 is the longest wait, not the shortest.
  static constexpr uint32_t kTensOfMicros[32] = {65536, 1,    2,    3,    4,     6,    8,     12,
                                                  16,    24,   32,   48,   64,    96,   128,   192,
                                                  256,   384,  512,  768,  1024,  1536, 2048,  3072,
                                                  4096,  6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return uint64_t{kTensOfMicros[code & 31]} * 10'000;
}

uint64_t ack_timeout_ns(uint32_t code) {
  if (code == 0) return 0;
  return 4096ULL << (code & 31);
}

}  // namespace softhca::transport
