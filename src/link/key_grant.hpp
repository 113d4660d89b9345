// What one registered key lets the direct path reach, worked out once per
// version of the key's registry slot instead of at every operation.
//
// The direct path (link::Channel::copy_direct and its SEND's receive SGEs,
// QueuePair::post_direct_locked) asked, per operation: the key's slot still
// at the version it was read at, the key's PD, type 2 window QP, access and
// range (transport::key_allows), then where the address lands (the owner's address, then the window onto
// the owner's file, Attachment::in_backing). Everything but the slot's
// version, the access asked and the range is the same from one operation to
// the next while the version stands, so a KeyGrant keeps the answer: the
// accesses the key grants, the addresses [lo, hi) that are both inside the
// key and inside the window mapped here, and the distance from an address
// to its byte here. An operation then costs one version load (under the
// access announcement, as the lookup's was), a mask and two comparisons.
//
// A grant is never wider than what key_allows and in_backing would let
// through (tests/unit/key_grant_test.cpp compares them address by address):
// whatever it does not cover (another key, an on-demand MR, a range past the
// mapped window, a changed slot) misses and goes the way it went before,
// which works the grant out again when it succeeds.
#pragma once

#include <cstdint>

#include "host/host_registry.hpp"
#include "host/peer_backings.hpp"
#include "transport/memory_key.hpp"

namespace softhca::link {

struct KeyGrant {
  uint32_t key = 0;     // 0: grants nothing
  uint32_t seq = 0;     // the key's registry slot version it was worked out at
  uint32_t access = 0;  // IBV_ACCESS_* flags the key grants
  uint64_t lo = 0;      // [lo, hi): addresses (the key's own, iova) granted
  uint64_t hi = 0;
  uint64_t delta = 0;   // address a is at byte a + delta here (modulo 2^64)
  uint64_t owner_delta = 0;  // and at a + owner_delta in its owner's address space

  // Where [addr, addr + length) with `needed` access lands, or nullptr when
  // this grant does not say (the caller checks the slot's version itself,
  // under its access announcement).
  [[gnu::always_inline]] char* find(uint32_t k, uint32_t needed, uint64_t addr, uint64_t length) const {
    if (k != key || (access & needed) != needed || addr < lo || addr > hi || length > hi - addr) return nullptr;
    return reinterpret_cast<char*>(addr + delta);
  }
  // find(), while key `k`'s registry slot is still at the version the grant
  // was worked out at (one load; the caller holds its access announcement,
  // under which the slot cannot change unseen). nullptr: judge the key the
  // way the grant was worked out, which gives the grant for the next time.
  // (Always inlined: it is on the way of every direct operation.)
  [[gnu::always_inline]] char* find_current(const host::HostRegistry& registry, uint32_t k, uint32_t needed,
                                            uint64_t addr, uint64_t length) const {
    char* at = find(k, needed, addr, length);
    return at != nullptr && registry.mr_version(k) == seq ? at : nullptr;
  }
  // The owner's address of `addr`, which find() granted.
  uint64_t owner_address(uint64_t addr) const { return addr + owner_delta; }
};

namespace grant_detail {
// The grant of `key` (already judged usable) over the owner addresses
// [olo, ohi), landing at `here(olo)`.
inline KeyGrant make(const transport::MemoryKey& key, uint32_t seq, uint64_t olo, uint64_t ohi, uint64_t here_at_olo) {
  KeyGrant g;
  if (olo >= ohi) return g;
  g.key = key.key;
  g.seq = seq;
  g.access = key.access;
  g.lo = key.iova + (olo - key.host_addr);
  g.hi = key.iova + (ohi - key.host_addr);
  g.delta = here_at_olo - g.lo;
  g.owner_delta = key.host_addr - key.iova;
  return g;
}

// The owner addresses of `key`: [host_addr, host_addr + length), or none
// where they would wrap.
inline bool key_span(const transport::MemoryKey& key, uint64_t& olo, uint64_t& ohi) {
  if (key.length == 0 || key.host_addr + key.length < key.host_addr || key.iova + key.length < key.iova) return false;
  olo = key.host_addr;
  ohi = key.host_addr + key.length;
  return true;
}

// Narrows [olo, ohi) to what `span` holds and `window` maps; false when
// nothing is left.
inline bool within_window(const host::SharedSpan& span, const host::PeerBackings::View& window, uint64_t& olo,
                          uint64_t& ohi) {
  if (span.length == 0 || window.base == nullptr || window.length <= span.offset) return false;
  const uint64_t mapped = window.length - span.offset;  // span bytes the window reaches
  const uint64_t span_end = span.addr + (span.length < mapped ? span.length : mapped);
  if (span_end < span.addr) return false;
  if (olo < span.addr) olo = span.addr;
  if (ohi > span_end) ohi = span_end;
  return olo < ohi;
}
}  // namespace grant_detail

// An rkey of another process's MR or window, as a QP of PD `pd_id` and
// number `qpn` of that process receives it, reached through `window` onto
// its owner's file (what ShmChannel::copy_direct checks).
inline KeyGrant remote_grant(const transport::MemoryKey& key, const host::SharedSpan& span, uint32_t seq,
                             uint32_t pd_id, uint32_t qpn, const host::PeerBackings::View& window) {
  uint64_t olo = 0, ohi = 0;
  if (key.key == 0 || key.pd_id != pd_id || transport::is_on_demand(key) ||
      (key.kind == transport::KeyKind::kWindow2 && key.qpn != qpn) || !grant_detail::key_span(key, olo, ohi) ||
      !grant_detail::within_window(span, window, olo, ohi))
    return {};
  const uint64_t here = reinterpret_cast<uint64_t>(window.base) + span.offset + (olo - span.addr);
  return grant_detail::make(key, seq, olo, ohi, here);
}

// The lkey of a receive WQE of another process, whose QP or SRQ is of PD
// `pd_id`: an MR (never a window), reached only through `window` onto its
// owner's file (what ShmChannel::send_direct checks of each receive SGE).
inline KeyGrant receive_grant(const transport::MemoryKey& key, const host::SharedSpan& span, uint32_t seq,
                              uint32_t pd_id, const host::PeerBackings::View& window) {
  uint64_t olo = 0, ohi = 0;
  if (key.key == 0 || key.pd_id != pd_id || key.kind != transport::KeyKind::kRegion || transport::is_on_demand(key) ||
      !grant_detail::key_span(key, olo, ohi) || !grant_detail::within_window(span, window, olo, ohi))
    return {};
  const uint64_t here = reinterpret_cast<uint64_t>(window.base) + span.offset + (olo - span.addr);
  return grant_detail::make(key, seq, olo, ohi, here);
}

// An lkey of this process for a QP of PD `pd_id`: an MR (never a window),
// reached through our own window where its pages moved into our file, and at
// its own address where none of them did (what post_direct_locked checks).
inline KeyGrant local_grant(const transport::MemoryKey& key, const host::SharedSpan& span, uint32_t seq,
                            uint32_t pd_id, const host::PeerBackings::View& window) {
  uint64_t olo = 0, ohi = 0;
  if (key.key == 0 || key.pd_id != pd_id || key.kind != transport::KeyKind::kRegion || transport::is_on_demand(key) ||
      !grant_detail::key_span(key, olo, ohi))
    return {};
  if (span.length == 0) return grant_detail::make(key, seq, olo, ohi, olo);  // nothing moved: the address itself
  if (!grant_detail::within_window(span, window, olo, ohi)) return {};
  const uint64_t here = reinterpret_cast<uint64_t>(window.base) + span.offset + (olo - span.addr);
  return grant_detail::make(key, seq, olo, ohi, here);
}

}  // namespace softhca::link
