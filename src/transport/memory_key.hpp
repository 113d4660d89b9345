// The protection check of every memory reference, in one place: a local SGE
// (requester), a receive WQE's SGE and an rkey'd range (responder) all pass
// it. IBTA 10.6.3 / the verbs manual 3.4: the key must belong to the QP's PD,
// grant the access the operation needs, and cover [addr, addr + length)
// without wrapping the address space.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softhca::transport {

// What a key names: a memory region, or a memory window (an rkey only).
enum class KeyKind : uint32_t { kRegion = 0, kWindow1 = 1, kWindow2 = 2 };

// A registered key as the owner's registry records it. A window's key
// describes the part of its MR that it grants, with the window's access; an
// unbound (invalidated) window has length 0.
struct MemoryKey {
  uint32_t key = 0;
  uint32_t pd_id = 0;
  uint32_t access = 0;     // IBV_ACCESS_* flags
  uint64_t iova = 0;       // the address peers use
  uint64_t length = 0;
  uint64_t host_addr = 0;  // where iova maps in the owner's address space
  KeyKind kind = KeyKind::kRegion;
  uint32_t qpn = 0;        // a bound type 2 window: the QP it is bound to
  bool operator==(const MemoryKey&) const = default;
};

// True if `mr` lets a reference of `length` bytes at `addr` with `access`
// through, for a QP of protection domain `pd_id`. A zero-length reference is
// checked like any other: callers skip empty SGEs themselves where the verbs
// allow it.
inline bool key_allows(const MemoryKey& mr, uint32_t pd_id, uint32_t access, uint64_t addr, uint64_t length) {
  return mr.pd_id == pd_id && (mr.access & access) == access && addr >= mr.iova && addr + length >= addr &&
         addr + length <= mr.iova + mr.length;
}

// An implicit on-demand-paging MR (ibv_reg_mr(pd, NULL, SIZE_MAX, ...|ON_DEMAND)):
// the owner's whole address space, of which nothing was checked at
// registration, so every reference through it is checked when it is used.
inline bool is_implicit_odp(const MemoryKey& mr) {
  return (mr.access & IBV_ACCESS_ON_DEMAND) != 0 && mr.iova == 0 && mr.length == UINT64_MAX;
}

// Any on-demand-paging MR, explicit or implicit: it names addresses, not
// pages, and the owner may unmap or replace the pages under it at any time,
// so a copy into or out of the owner's own memory checks first that the
// range is mapped now (a NIC takes a page fault that fails; a copy here
// would fault the process).
inline bool is_on_demand(const MemoryKey& mr) { return (mr.access & IBV_ACCESS_ON_DEMAND) != 0; }

// An lkey (a local SGE, a receive WQE's SGE) names an MR, never a window.
inline bool local_key_allows(const MemoryKey& mr, uint32_t pd_id, uint32_t access, uint64_t addr, uint64_t length) {
  return mr.kind == KeyKind::kRegion && key_allows(mr, pd_id, access, addr, length);
}

// An rkey arriving at QP `qpn`: an MR, a type 1 window of the QP's PD, or a
// type 2 window bound to that very QP (IBTA 10.6.7.2, rxe's lookup of a window).
inline bool remote_key_allows(const MemoryKey& mr, uint32_t pd_id, uint32_t qpn, uint32_t access, uint64_t addr,
                              uint64_t length) {
  if (mr.kind == KeyKind::kWindow2 && mr.qpn != qpn) return false;
  return key_allows(mr, pd_id, access, addr, length);
}

// The owner's address of `addr` inside `mr` (only after key_allows).
inline void* owner_address(const MemoryKey& mr, uint64_t addr) {
  return reinterpret_cast<void*>(mr.host_addr + (addr - mr.iova));
}

}  // namespace softhca::transport
