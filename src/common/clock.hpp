// The one clock of softhca's timers: CLOCK_MONOTONIC in nanoseconds. Read at
// the edges (a verb call, a progress-thread wake-up) and passed inward as
// `now`, so that the transport's logic runs on a virtual clock in tests.
#pragma once

#include <time.h>

#include <cstdint>

namespace softhca {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// How long from now until `deadline_ns` (a monotonic_ns() value), for a
// relative wait that ends then; zero once it has passed.
inline timespec time_until(uint64_t deadline_ns) {
  const uint64_t now = monotonic_ns();
  const uint64_t delta = deadline_ns > now ? deadline_ns - now : 0;
  return timespec{static_cast<time_t>(delta / 1'000'000'000ULL), static_cast<long>(delta % 1'000'000'000ULL)};
}

}  // namespace softhca
