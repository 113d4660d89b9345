// Tag matching (IBV_SRQT_TM): the headers a tagged message starts with, and
// the matching list of a TM SRQ with its phase (unexpected-count) state.
//
// A message to an RC QP on a TM SRQ begins with a 16-byte TM header (TMH):
//   byte 0 opcode (IBV_TMH_NO_TAG / RNDV / FIN / EAGER), bytes 4-7 app_ctx
//   (reported as ibv_wc_tm_info.priv), bytes 8-15 the tag, all big-endian.
// A rendezvous (RNDV) message follows it with a 16-byte RVH: the sender's
// va (8), rkey (4) and length (4), big-endian; the receiver READs that range.
//
// The list is plain data in shared memory (the SRQ owner's process segment):
// the owner adds and removes entries (ibv_post_srq_ops), and whichever
// process runs the responder matches against it, under the list's spin lock.
// Pure: no clock, no I/O; the owner and the responder call it.
//
// Phase synchronisation (man ibv_post_srq_ops): every message that finds no
// tag (an unexpected one) advances `unexpected`; the application reports how
// many it has handled with IBV_OPS_TM_SYNC (`synced`). While the two differ
// the list matches nothing — a tag added before software saw an unexpected
// message must not take a later message that the earlier one should have
// gone to — and every list operation's completion asks for a sync
// (IBV_WC_TM_SYNC_REQ).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "common/limits.hpp"
#include "common/result.hpp"
#include "transport/responder_port.hpp"

namespace softhca::transport {

inline constexpr uint32_t kTmHeaderBytes = 16;
inline constexpr uint32_t kRndvHeaderBytes = 16;

enum class TmOpcode : uint8_t { kNoTag = 0, kRndv = 1, kFin = 2, kEager = 3 };

struct TmHeader {
  uint8_t opcode = 0;
  uint32_t app_ctx = 0;
  uint64_t tag = 0;
};

struct RndvHeader {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

TmHeader decode_tm_header(std::span<const unsigned char, kTmHeaderBytes> bytes);
void encode_tm_header(const TmHeader& header, std::span<unsigned char, kTmHeaderBytes> out);
RndvHeader decode_rndv_header(std::span<const unsigned char, kRndvHeaderBytes> bytes);

// One posted tagged buffer.
struct TagEntry {
  uint64_t tag;
  uint64_t mask;
  uint64_t wr_id;      // the ADD's recv_wr_id: the TM_RECV completion's wr_id
  uint64_t seq;        // posting order: the oldest matching entry wins
  uint32_t in_use;
  uint32_t num_sge;
  ReceiveSge sge[limits::kTmMaxSge];
};

// The matching list: this header, then max_tags TagEntry slots. A slot's
// index is the handle IBV_WR_TAG_ADD returns and IBV_WR_TAG_DEL names.
struct TagList {
  std::atomic<uint32_t> lock_word;
  uint32_t max_tags;
  uint32_t used;
  uint32_t unexpected;  // messages found unexpected so far (the device's count)
  uint32_t synced;      // the unexpected count software last reported
  uint32_t next_slot;   // where the search for a free slot starts
  uint64_t next_seq;

  static uint64_t bytes_for(uint32_t max_tags) { return sizeof(TagList) + uint64_t{max_tags} * sizeof(TagEntry); }
  // In zeroed memory of bytes_for(max_tags) bytes.
  static TagList* init(void* memory, uint32_t max_tags);

  TagEntry* entries() { return reinterpret_cast<TagEntry*>(this + 1); }

  // Taking the lock over from a dead holder recounts `used`, which the
  // holder may have left half-updated (an entry's in_use is one store).
  void lock(const LockTaker& me = {});
  void unlock() { lock_word.store(0, std::memory_order_release); }

  // Owner side (each takes the lock as `me`).
  // IBV_WR_TAG_ADD: the new entry's handle; ENOMEM when the list is full,
  // EINVAL for more SGEs than an entry holds.
  Result<uint32_t> add(uint64_t tag, uint64_t mask, uint64_t wr_id, const ReceiveSge* sges, uint32_t num_sge,
                       const LockTaker& me = {});
  // IBV_WR_TAG_DEL: false when the handle names no entry (consumed by a
  // message meanwhile, or never added).
  bool remove(uint32_t handle, const LockTaker& me = {});
  // IBV_OPS_TM_SYNC: software has handled `unexpected_cnt` unexpected messages.
  void report(uint32_t unexpected_cnt, const LockTaker& me = {});
  // Whether software has seen every unexpected message (matching is on).
  bool in_sync(const LockTaker& me = {});

  // Responder side, under lock()/unlock().
  // The oldest entry whose tag equals the message's under the entry's
  // mask, taken off the list; nothing while out of sync.
  std::optional<TagEntry> match_locked(uint64_t tag);
  void count_unexpected_locked() { ++unexpected; }
  bool in_sync_locked() const { return unexpected == synced; }
};

}  // namespace softhca::transport
