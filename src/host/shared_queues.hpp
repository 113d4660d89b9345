// The queues that live in a process segment and that initiators of any process
// operate on directly: completion queues (many producers, one consumer),
// receive queues (one producer, many consumers) and the owner's event ring.
//
// Memory ordering, per function:
//  - CQ: a producer acquires the ring offset, reserves slot `h` by CAS on the
//    ring's `head`, fills the entry, then publishes it with a release store of
//    `seq = h + 1`; the consumer acquires `seq`, reads the entry, and releases
//    the slot by storing `tail`. Resize closes `head` with an atomic OR, waits
//    for the reserved slots to be published, copies them, then stores the new
//    ring's offset. A producer counts itself in `pushers` before it reads the
//    offset, so once the owner sees `pushers` at zero after that store, no
//    producer can reach the old ring and it is freed (seq_cst on both sides).
//    A producer that holds an access announcement to the owner's process is
//    not counted: the owner fences the announcements (as ibv_dereg_mr does)
//    before it frees. Without a completion channel a push publishes with a
//    release store and reads no arm.
//  - RQ: the owner fills slot `head`, then release-stores head + 1; a consumer
//    acquire-loads head, copies slot `tail` and claims it by CAS on `tail`
//    (the copy is valid if the CAS succeeds: the owner only rewrites a slot
//    after `tail` has passed it).
#pragma once

#include <linux/futex.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/counters.hpp"

namespace softhca::host {

// One completion, laid out for a 64-byte cache line.
struct Cqe {
  uint64_t wr_id;
  uint32_t status;       // ibv_wc_status
  uint32_t opcode;       // ibv_wc_opcode
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data;     // network byte order, as ibv_wc carries it
  uint32_t qp_num;
  uint32_t src_qp;
  uint32_t wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
  uint8_t solicited;
  uint8_t flags;         // kCqeSendPosition
  uint64_t timestamp;    // completion clock (ns), when the CQ asked for timestamps
};
// A send completion carries its WQE's position in the send queue in `src_qp`
// (meaningless for send completions, reported as 0): polling it frees that
// slot and every earlier one, as the WQE counter of a ConnectX CQE does.
inline constexpr uint8_t kCqeSendPosition = 1;
// A receive completion of an XRC SRQ (it names the XRC_RECV QP, which feeds
// no CQ): `vendor_err` carries the owner's SRQ id, so that polling it frees
// the SRQ's slot; reported as 0.
inline constexpr uint8_t kCqeXrcSrq = 2;
// Tag matching: the completion took no receive WQE (a tagged buffer's, or
// a list operation's): polling it frees no queue slot.
inline constexpr uint8_t kCqeNoWqe = 4;
// Tag matching: `src_qp` and `vendor_err` carry the high and low halves of
// the message's tag, `imm_data` its app_ctx (ibv_wc_read_tm_info); the
// three read as 0.
inline constexpr uint8_t kCqeTmInfo = 8;
// A receive completion of a WQE taken from a QP's own receive queue, whose
// taker says where: `vendor_err` carries the WQE's position (low 32 bits),
// reported as 0. The owner then knows the queue's tail has passed it
// without reading the tail's line (QueuePair::retire_recv).
inline constexpr uint8_t kCqeRecvPosition = 16;

struct alignas(64) CqSlot {
  std::atomic<uint64_t> seq;  // h + 1 once entry h is published
  Cqe cqe;
};
static_assert(sizeof(CqSlot) == 64, "a CQ slot is one cache line");

// The device's free-running completion clock: CLOCK_MONOTONIC in ns, the same
// in every process of the host (hca_core_clock 1 GHz, 64 bits wide).
inline uint64_t completion_clock_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The slots of a CQ. A CQ keeps one ring at a time; ibv_resize_cq replaces it
// by closing the old one (bit 63 of `head`, so no producer can reserve there
// any more), copying what it holds into a new ring and publishing the new
// ring's offset in the SharedCq.
struct CqRing {
  static constexpr uint64_t kClosed = 1ULL << 63;
  uint32_t capacity;  // power of two
  uint32_t pad;
  alignas(64) std::atomic<uint64_t> head;  // producer reservations; kClosed once replaced
  // A value `tail` had, written by producers only: while head is less than
  // a ring ahead of it, a producer need not read `tail`, whose line the
  // consumer writes at every poll (a cache miss per completion otherwise).
  // Never above the real tail, so it can only make a producer look again.
  std::atomic<uint64_t> tail_seen;
  alignas(64) std::atomic<uint64_t> tail;  // consumer position
  alignas(64) CqSlot slots[];

  static uint64_t bytes_for(uint32_t capacity) { return sizeof(CqRing) + uint64_t{capacity} * sizeof(CqSlot); }
  CqSlot& slot(uint64_t position) { return slots[position & (capacity - 1)]; }

  // Thread: the owner's consumer (under the CQ's consumer lock).
  bool pop(Cqe& out) {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    CqSlot& s = slot(t);
    // seq_cst (a plain load on x86): after an arm, see SharedCq::push_to_ring.
    if (s.seq.load(std::memory_order_seq_cst) != t + 1) return false;
    out = s.cqe;
    tail.store(t + 1, std::memory_order_release);
    return true;
  }
  bool empty() {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    return slot(t).seq.load(std::memory_order_seq_cst) != t + 1;
  }

  // Thread: the owner's consumer. Removes the completions for which
  // drop(position, cqe) holds from the published part of the ring -- from
  // the tail to the first slot a producer reserved and has not filled yet,
  // the part only the consumer touches -- moving the others towards the
  // head in their order, and advances the tail past the room freed.
  // Nothing from the first unfilled slot on is read or moved (its producer
  // may be writing it, and those after it). Every slot keeps the sequence
  // number of its lap: a slot the tail passes over is free for the next
  // lap's producer, and the one the tail reaches holds a published
  // completion. Returns where the published part ended.
  template <class Drop>
  uint64_t remove_published_if(Drop drop) {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    uint64_t published = t;
    while (slot(published).seq.load(std::memory_order_acquire) == published + 1) ++published;
    uint64_t kept_from = published;
    for (uint64_t position = published; position-- > t;) {
      const Cqe& c = slot(position).cqe;
      if (drop(position, c)) continue;
      --kept_from;
      if (kept_from != position) slot(kept_from).cqe = c;
    }
    if (kept_from != t) tail.store(kept_from, std::memory_order_release);
    return published;
  }
};

// A completion queue as initiators see it: where its ring is, how it is armed.
// QPs name it by the offset of this header, which never moves.
struct SharedCq {
  uint32_t owner_cq_id;       // the owner's local id for notifications
  uint32_t owner_serial;      // ... and which CQ of that id (Event::tag)
  uint32_t owner_proc;        // registry proc slot of the owner
  std::atomic<uint64_t> ring_offset;           // the current CqRing in the owner's segment
  uint32_t stamp_completions;                  // 1: producers write Cqe::timestamp
  // 1: the CQ has a completion channel. Without one no event can be raised,
  // so producers need not read `armed` after they publish (nor order the
  // two with a locked instruction).
  uint32_t has_channel;
  alignas(64) std::atomic<uint32_t> armed;     // 0, kArmNext or kArmSolicited
  std::atomic<uint32_t> overrun;               // set once: the CQ is in error
  std::atomic<uint32_t> pushers;               // producers inside push() now

  static constexpr uint32_t kArmNext = 1;
  static constexpr uint32_t kArmSolicited = 2;

  enum class Push { kOk, kOkNotify, kOverrun };
  // Thread: any initiator of any process. `base` is the owner's segment as
  // mapped by the caller.
  Push push(char* base, const Cqe& cqe) {
    // Counted in `pushers` while it may hold a pointer into a ring, so that
    // a resize knows when a replaced ring is no longer reachable.
    pushers.fetch_add(1, std::memory_order_seq_cst);
    const Push result = push_to_ring(base, cqe);
    pushers.fetch_sub(1, std::memory_order_release);
    return result;
  }
  // push() for a producer that holds an access announcement to the owner's
  // process (HostRegistry::begin_access): instead of `pushers`, a resize
  // waits for that announcement to end (HostRegistry::fence_accesses), as
  // ibv_dereg_mr waits for a copy into the range it releases.
  Push push_announced(char* base, const Cqe& cqe) { return push_to_ring(base, cqe); }

  // Thread: the owner, after publishing a new ring_offset. True when no
  // producer can still be inside a ring that was current before.
  bool quiescent() const { return pushers.load(std::memory_order_seq_cst) == 0; }

 private:
  Push push_to_ring(char* base, const Cqe& cqe) {
    for (;;) {
      if (overrun.load(std::memory_order_relaxed)) return Push::kOverrun;
      auto* ring = reinterpret_cast<CqRing*>(base + ring_offset.load(std::memory_order_seq_cst));
      bool reserved = false;
      uint64_t h = 0;
      for (;;) {
        // tail before head: tail never passes head, so h - t cannot underflow
        // (with a stale h read first, a preempted producer saw a huge
        // difference and declared a spurious overrun).
        uint64_t t = ring->tail_seen.load(std::memory_order_relaxed);
        h = ring->head.load(std::memory_order_acquire);
        if (h & CqRing::kClosed) break;
        if (h - t >= ring->capacity) {
          t = ring->tail.load(std::memory_order_acquire);
          h = ring->head.load(std::memory_order_acquire);
          if (h & CqRing::kClosed) break;
          if (h - t >= ring->capacity && h - ring->tail.load(std::memory_order_acquire) >= ring->capacity) {
            overrun.store(1, std::memory_order_relaxed);
            return Push::kOverrun;
          }
          ring->tail_seen.store(t, std::memory_order_relaxed);
        }
        if (ring->head.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
          reserved = true;
          break;
        }
      }
      if (!reserved) {  // a resize is moving the ring: wait for the new offset
        __builtin_ia32_pause();
        continue;
      }
      CqSlot& slot = ring->slot(h);
      slot.cqe = cqe;
      if (stamp_completions != 0) slot.cqe.timestamp = completion_clock_ns();
      if (has_channel == 0) {  // nothing to notify: the store alone publishes
        slot.seq.store(h + 1, std::memory_order_release);
        return Push::kOk;
      }
      // seq_cst, as are the load of `armed` after it, the owner's arm
      // (CompletionQueue::arm) and its reads of the ring (CqRing::pop): a
      // store then a load of another word, on both sides. With release/acquire the load could pass the store (x86 lets
      // it), and an owner that arms and then finds the ring empty would sleep
      // while this producer saw the CQ unarmed: a lost completion event.
      slot.seq.store(h + 1, std::memory_order_seq_cst);
      return notify_after(cqe);
    }
  }

  // An armed CQ fires once for the next completion (or for the next solicited
  // or error completion when armed for solicited only).
  Push notify_after(const Cqe& cqe) {
    uint32_t arm = armed.load(std::memory_order_seq_cst);  // see push_to_ring
    while (arm != 0) {
      const bool fires = arm == kArmNext || cqe.solicited || cqe.status != 0;
      if (!fires) break;
      if (armed.compare_exchange_weak(arm, 0, std::memory_order_acq_rel)) return Push::kOkNotify;
    }
    return Push::kOk;
  }
};

struct RecvSge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  // The WQE's position in its queue plus one (low 32 bits), stored once it
  // is posted and after the queue's head: an initiator that finds the
  // position it expects here knows the WQE is posted without reading the
  // head, a line the owner writes at every post (SharedRq::posted_at).
  uint32_t posted;
  RecvSge sge[];
};

struct SharedRq {
  uint32_t capacity;  // power of two
  uint32_t max_sge;
  uint32_t stride;    // bytes per WQE
  uint32_t owner_srq_id;  // for SRQ_LIMIT_REACHED; 0 for a QP's own RQ
  uint32_t owner_serial;  // ... and which SRQ of that id (Event::tag)
  uint32_t owner_proc;
  uint32_t pd_id;
  // A tag matching SRQ: its transport::TagList, at this offset of the
  // owner's segment; 0 for any other receive queue.
  uint64_t tag_list_offset;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> limit;  // SRQ limit; 0 = not armed
  alignas(64) unsigned char wqes[];

  static uint32_t stride_for(uint32_t max_sge) {
    return static_cast<uint32_t>((sizeof(RecvWqe) + max_sge * sizeof(RecvSge) + 15) & ~15u);
  }
  static uint64_t bytes_for(uint32_t capacity, uint32_t max_sge) {
    return sizeof(SharedRq) + uint64_t{capacity} * stride_for(max_sge);
  }
  RecvWqe* slot(uint64_t index) { return reinterpret_cast<RecvWqe*>(wqes + (index & (capacity - 1)) * stride); }

  // Thread: the owner. Advances its count of retired WQEs (`retired`, kept by
  // the owner) by up to `count`, never past what initiators took: a
  // completion that names no taken WQE (a stale one) frees nothing.
  // `taken_floor` (optional, the owner's): a count known not to pass `taken`,
  // read instead of `taken` while it shows WQEs to retire, and raised when
  // `taken` is read.
  static void retire(std::atomic<uint64_t>& retired, const std::atomic<uint64_t>& taken, uint64_t count,
                     std::atomic<uint64_t>* taken_floor = nullptr) {
    uint64_t r = retired.load(std::memory_order_acquire);
    while (count > 0) {
      uint64_t t = taken_floor != nullptr ? taken_floor->load(std::memory_order_acquire) : r;
      if (t <= r) {
        t = taken.load(std::memory_order_acquire);
        if (taken_floor != nullptr) raise_to(*taken_floor, t);
      }
      if (r >= t) return;
      const uint64_t next = r + (count < t - r ? count : t - r);
      if (retired.compare_exchange_weak(r, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        count -= next - r;
        r = next;
      }
    }
  }

  // Raises `floor` to `value` unless it is already there or above.
  static void raise_to(std::atomic<uint64_t>& floor, uint64_t value) {
    uint64_t f = floor.load(std::memory_order_relaxed);
    while (f < value && !floor.compare_exchange_weak(f, value, std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
  }

  uint64_t outstanding() const {
    return head.load(std::memory_order_acquire) - tail.load(std::memory_order_acquire);
  }
  // Thread: the owner (under its post lock). False when full.
  // `tail_at_most` is a count the owner keeps that never passes `tail` (its
  // retired WQEs): while it shows room, `tail` itself, whose line initiators
  // write at every SEND they take, is not read.
  bool push(uint64_t wr_id, const RecvSge* sges, uint32_t num_sge, uint64_t tail_at_most) {
    const uint64_t h = head.load(std::memory_order_relaxed);
    if (h - tail_at_most >= capacity && h - tail.load(std::memory_order_acquire) >= capacity) return false;
    RecvWqe* wqe = slot(h);
    wqe->wr_id = wr_id;
    wqe->num_sge = num_sge;
    // One SGE at a time, inline, for the one or two a receive usually has:
    // a memcpy of a length known only here is a call into libc (the same
    // copy on the sender's side became `rep movs`, slow to start).
    for (uint32_t i = 0; i < num_sge; ++i) wqe->sge[i] = sges[i];
    head.store(h + 1, std::memory_order_release);
    // After the head: whoever saw the mark sees a head past this WQE, so a
    // taker that trusted the mark never moves the tail past the head (the
    // general path's take reads tail != head as a WQE to take).
    std::atomic_ref<uint32_t>(wqe->posted).store(static_cast<uint32_t>(h + 1), std::memory_order_release);
    return true;
  }
  // Thread: any initiator. The WQE at position `t` when its mark says it is
  // posted, else nullptr (not posted, or its mark not stored yet: ask the
  // head). A slot holds the mark of its latest post, a ring back or this
  // one, so a stale mark never matches.
  const RecvWqe* posted_at(uint64_t t) {
    RecvWqe* wqe = slot(t);
    const uint32_t mark = std::atomic_ref<uint32_t>(wqe->posted).load(std::memory_order_acquire);
    return mark == static_cast<uint32_t>(t + 1) ? wqe : nullptr;
  }
  // Thread: any initiator. Copies the claimed WQE into `out` (room for max_sge);
  // returns false when empty. `remaining` receives the WQEs left after the claim.
  bool take(RecvWqe* out, uint64_t* remaining) {
    uint64_t t = tail.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t h = head.load(std::memory_order_acquire);
      if (t == h) return false;
      const RecvWqe* wqe = slot(t);
      out->wr_id = wqe->wr_id;
      uint32_t n = wqe->num_sge;
      if (n > max_sge) n = max_sge;
      out->num_sge = n;
      std::memcpy(out->sge, wqe->sge, n * sizeof(RecvSge));
      if (tail.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        if (remaining) *remaining = h - (t + 1);
        return true;
      }
    }
  }
};

// The responder-visible state of a QP.
struct SharedQp {
  std::atomic<uint32_t> state;    // ibv_qp_state; kDestroyed once gone
  // A TGT QP served over the udp link: kResumeValid | the PSN where its
  // responder would start again (the next one, or the first of a message
  // in progress: ResponderFlow::resume_psn), kept by the serving process so
  // that another holder can take over the peer; 0 until a packet arrives.
  std::atomic<uint32_t> resume_psn;
  uint32_t qpn;
  uint32_t qp_type;               // ibv_qp_type
  uint32_t owner_proc;
  uint32_t owner_qp_id;           // the owner's local id for async events
  uint32_t pd_id;
  std::atomic<uint32_t> access;   // qp_access_flags
  std::atomic<uint32_t> qkey;
  std::atomic<uint32_t> dest_qpn;
  std::atomic<uint32_t> min_rnr_timer;
  std::atomic<uint32_t> max_dest_rd_atomic;
  std::atomic<uint32_t> comm_established;  // first message arrived in RTR: COMM_EST raised
  uint32_t xrcd_id;               // XRC_RECV QPs and XRC SRQ records: their XRC domain
  uint64_t rq_offset;             // SharedRq of the QP, 0 when it uses an SRQ
  uint64_t srq_offset;            // SharedRq of its SRQ, or 0
  uint64_t recv_cq_offset;        // SharedCq that receives its receive completions
  // (Which QP this is beyond its QPN, its incarnation, is kept in its
  // registry slot: QpSlot::incarnation.)
  // The QP's counters (common/counters.hpp), read by `softhca stat`.
  Counters counters;

  static constexpr uint32_t kDestroyed = 0xFFFF;
  static constexpr uint32_t kResumeValid = 0x80000000u;
  // qp_type of the record an XRC SRQ publishes under its SRQ number (which
  // comes from the QPN space): no QP type, so no message is ever delivered
  // to it as a QP, and its state stays RESET. srq_offset names the SRQ's
  // ring, recv_cq_offset its CQ, pd_id its PD, owner_qp_id the owner's SRQ id.
  static constexpr uint32_t kXrcSrqRecord = 0x5352;
};

// What an initiator asks a target's owner to do (its progress thread does it).
enum class EventKind : uint32_t {
  kCqNotify = 1,      // object = owner_cq_id: signal the completion channel
  kCqError = 2,       // object = owner_cq_id: CQ overrun, IBV_EVENT_CQ_ERR
  kQpAsync = 3,       // object = owner_qp_id, detail = ibv_event_type
  kSrqLimit = 4,      // object = owner_srq_id
  kTgtSync = 5,       // object = a TGT QP handle's qp_id: its service or state changed (QueuePair::sync_tgt_channel)
};

struct Event {
  uint32_t kind;
  uint32_t object;
  uint32_t detail;
  // Which object of that id: kQpAsync, the QP's number; kCqNotify and
  // kCqError, the CQ's serial; kSrqLimit, the SRQ's serial. Object ids are
  // reused at once, so an event still in the ring when its object is
  // destroyed would otherwise be relayed to the next object of the process
  // that gets the id (an error event on a healthy QP, a completion event
  // for a CQ nothing completed on, an SRQ limit event on an SRQ never
  // armed). 0 elsewhere.
  uint32_t tag;
};

struct alignas(16) EventSlot {
  std::atomic<uint64_t> seq;
  Event event;
};

// The owner's doorbell and event ring, at the start of every segment.
struct SegmentHeader {
  static constexpr uint32_t kEventCapacity = 1024;
  uint64_t magic;
  uint32_t pid;
  uint32_t pad;
  // Held by the owner's progress thread while it runs: a robust,
  // process-shared mutex, so that when the owner dies the kernel itself marks
  // the lock word (FUTEX_OWNER_DIED) as it tears the process down. Peers that
  // reach the owner's memory through shared mappings, with no system call
  // that could fail with ESRCH, read the word to know it still lives.
  pthread_mutex_t owner_alive;

  // Thread: any. Whether the owner's progress thread holds owner_alive: the
  // mutex's lock word (the kernel's robust-futex word: owner TID, with
  // FUTEX_OWNER_DIED set once the owner died) names a live owner.
  bool owner_running() const {
    static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0, "glibc keeps the futex word first");
    auto& word = *reinterpret_cast<const std::atomic<uint32_t>*>(&owner_alive);
    const uint32_t value = word.load(std::memory_order_acquire);
    return (value & FUTEX_TID_MASK) != 0 && (value & FUTEX_OWNER_DIED) == 0;
  }
  alignas(64) std::atomic<uint32_t> doorbell;  // futex word: bumped after queueing an event
  std::atomic<uint32_t> sleeping;              // the owner thread is (about to be) in FUTEX_WAIT
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) EventSlot events[kEventCapacity];

  // Thread: any. False when the ring is full (the event is dropped; rare, logged).
  bool push(const Event& e) {
    uint64_t h = 0;
    for (;;) {
      const uint64_t t = tail.load(std::memory_order_acquire);  // before head: see SharedCq::push
      h = head.load(std::memory_order_acquire);
      if (h - t >= kEventCapacity) return false;
      if (head.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
    }
    EventSlot& slot = events[h % kEventCapacity];
    slot.event = e;
    slot.seq.store(h + 1, std::memory_order_release);
    return true;
  }
  // Thread: the owner's progress thread.
  bool pop(Event& out) {
    const uint64_t t = tail.load(std::memory_order_relaxed);
    EventSlot& slot = events[t % kEventCapacity];
    if (slot.seq.load(std::memory_order_acquire) != t + 1) return false;
    out = slot.event;
    tail.store(t + 1, std::memory_order_release);
    return true;
  }
};

}  // namespace softhca::host
