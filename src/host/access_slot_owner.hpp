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
// its MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED. Threads beyond the owned
// slots, and nested accesses, share the other slots with a CAS.
#pragma once

#include <cstdint>

namespace softhca::host {

inline constexpr uint32_t kOwnedAccessSlots = 8;

namespace access_slot_owner {

// This thread's owned slot: its index + 1; 0 before the thread first
// asked; kNoSlot when it asked and none could be had (all taken, or no
// membarrier). Initial-exec: a read relative to %fs, no __tls_get_addr.
inline constexpr uint32_t kNoSlot = ~0u;
inline thread_local uint32_t t_slot_plus1 __attribute__((tls_model("initial-exec"))) = 0;

// Claims a slot for this thread (once; out of line). Returns index + 1, or 0.
uint32_t claim();

// The index + 1 of this thread's slot, or 0 when it has none.
inline uint32_t owned_plus1() {
  const uint32_t v = t_slot_plus1;
  if (v - 1 < kOwnedAccessSlots) [[likely]] return v;
  return v == 0 ? claim() : 0;
}

// The fence side: makes every thread of every process that announces by
// plain stores pass a full memory barrier. False if the kernel refused
// (then such announcements may still sit in a store buffer; warned once).
bool fence_owners_everywhere();

}  // namespace access_slot_owner
}  // namespace softhca::host
