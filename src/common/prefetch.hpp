// Hints that start moving a cache line toward this core before an
// operation's checks are done, so that the line's trip overlaps them. They
// read and change nothing: a prefetch never faults, whatever the address,
// and only moves a copy of the line.
//
// The one that matters is the prefetch for writing (PREFETCHW): a line that
// another core holds, say a peer spinning on the byte an RDMA WRITE is about
// to store, must be taken from it before the store can complete; asking for
// it while the WRITE is still being validated takes that trip off the
// latency (docs/performance.md, "Session 21"). x86-64 CPUs without it (Intel
// before Broadwell) would fault on the instruction, so it is used only where
// CPUID says so, and a plain prefetch otherwise.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace softhca {

#if defined(__x86_64__)
inline bool cpu_prefetches_for_write() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 8)) != 0;  // PRFCHW
}
#endif

#if defined(__x86_64__)
// Asked once, when the library loads (a function-local static would cost a
// guard check on every prefetch).
inline const bool kCpuPrefetchesForWrite = cpu_prefetches_for_write();
#endif

inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__)
  if (kCpuPrefetchesForWrite) [[likely]] {
    asm volatile("prefetchw (%0)" : : "r"(p));  // an address only: no memory operand for sanitizers to check
    return;
  }
#endif
  __builtin_prefetch(p, 1, 3);
}

inline void prefetch_for_read(const void* p) { __builtin_prefetch(p, 0, 3); }

}  // namespace softhca
