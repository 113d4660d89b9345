// The heavy side of an asymmetric fence: membarrier(2) makes every running
// thread of this process pass a full memory barrier, so that a hot path in
// another thread may order its store before its load with a compiler
// barrier alone (the scheme of liburcu's membarrier flavour and of the
// membarrier(2) manual page). Users: FutexMutex's unlock, BiasedLock.
#pragma once

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace softhca::asymmetric_fence {

inline long membarrier(int cmd) { return ::syscall(SYS_membarrier, cmd, 0, 0); }

// Registers the process for expedited private membarriers, once, when the
// library loads (a registration carries over fork and ends at exec).
inline bool register_process() { return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0; }

// Whether the kernel gave the registration: where it did not (old kernels,
// a seccomp filter), hot paths keep their locked instructions.
inline const bool kAvailable = register_process();

// A full fence in every thread of the process. False if the kernel refuses
// it (a process that is not registered: a child that lost the registration
// and could not register again).
inline bool fence_all_threads() {
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  return errno == EPERM && register_process() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

// The light side: keeps the compiler from moving memory accesses across
// it; the CPU's reordering is what the heavy side's fence answers for.
inline void light_barrier() { std::atomic_signal_fence(std::memory_order_seq_cst); }

}  // namespace softhca::asymmetric_fence
