// Access slots that belong to one thread. An initiator announces each
// access to another process's memory in a slot of its own process
// (HostRegistry::begin_access), and a deregistration's fence reads every
// slot. A slot that several threads share must be claimed with a CAS per
// access -- a locked instruction before the store that every RDMA WRITE
// is waiting for. The first kOwnedAccessSlots slots of a process are
// instead each owned by one of its threads for as long as it lives (the
// same index in every registry the process maps): their owner announces
// with a plain store and a compiler barrier, and the fence side calls
// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) before it reads the slots,
// so that every thread of every process that announces this way has
// passed a full fence (the asymmetric Dekker of FutexMutex, across
// processes). A process announces this way only after the kernel took
// its MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED. A thread whose index is
// another's, and nested accesses, share the other slots with a CAS.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/thread_identity.hpp"

namespace softhca::host {

inline constexpr uint32_t kOwnedAccessSlots = 8;

namespace access_slot_owner {

// Which thread owns each owned index in this process (0: free): process
// state, not registry state, since a thread's index is the same in every
// registry the process maps and is given back at thread exit whatever
// registries remain. A thread may own only the index its thread pointer
// hashes to, so finding its slot is a hash and one load: no thread_local
// (an initial-exec one cannot be had by a library that is dlopen()ed, as
// UCX and pyverbs load us, and a dynamic one is a call per access).
inline std::atomic<uintptr_t> g_owner[kOwnedAccessSlots];

// Thread pointers of live threads lie a stack apart (megabytes); the
// multiplicative hash spreads them over the indices.
inline uint32_t index_of(uintptr_t thread) {
  static_assert(kOwnedAccessSlots == 8, "three bits of the hash");
  return static_cast<uint32_t>(((thread >> 12) * 0x9E3779B97F4A7C15ULL) >> 61);
}

// Out of line: claims this thread's index if it is free and the kernel
// took the registration. Returns index + 1, or 0.
uint32_t claim(uintptr_t thread, uint32_t index);

// The index + 1 of this thread's slot, or 0 when it has none (its index
// belongs to another live thread, or no membarrier here).
[[gnu::always_inline]] inline uint32_t owned_plus1() {
  const uintptr_t me = current_thread();
  const uint32_t index = index_of(me);
  // Only this thread ever stores its own pointer here.
  const uintptr_t owner = g_owner[index].load(std::memory_order_relaxed);
  if (owner == me) [[likely]] return index + 1;
  return owner == 0 ? claim(me, index) : 0;
}

// The fence side: makes every thread of every process that announces by
// plain stores pass a full memory barrier. False if the kernel refused
// (then such announcements may still sit in a store buffer; warned once).
bool fence_owners_everywhere();

}  // namespace access_slot_owner
}  // namespace softhca::host
