// A completion queue. Its ring lives in the process segment (host::SharedCq) so
// that initiators in any process post receive completions into it directly;
// this object is the owner's side: polling, arming, events, resize.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"
#include "common/biased_lock.hpp"
#include "common/spinlock.hpp"
#include "engine/context.hpp"
#include "host/shared_queues.hpp"

namespace softhca::engine {

// A completion as the engine hands it to the ABI (one CQ slot's entry).
using Completion = host::Cqe;
// The device's completion clock (hca_core_clock), in ns.
inline uint64_t completion_clock_ns() { return host::completion_clock_ns(); }

class CompletionChannel;
class QueuePair;
class SharedReceiveQueue;

class CompletionQueue {
 public:
  // timestamps: every completion records the completion clock
  // (host::completion_clock_ns) when it is written to the CQ.
  static Result<CompletionQueue*> create(Context& context, int cqe, CompletionChannel* channel,
                                         bool timestamps = false);
  ~CompletionQueue();

  // Fills up to `n` work completions; returns how many (ibv_poll_cq).
  int poll(int n, ibv_wc* wc);
  // One completion in engine form, for the extended poll API.
  bool poll_one(Completion& out);
  void arm(bool solicited_only);
  Result<void> resize(int cqe);

  // Posts a completion generated in this process (send completions, flushes).
  void push(const host::Cqe& cqe);
  // A QP moved to RESET: its completions still in the ring are discarded, as
  // hardware providers clean the CQ on reset (mlx5 cq_clean, rxe reset), and
  // the room they took is free at once (but for those a producer is still
  // writing, which are skipped when polled).
  // Returns how many of them were receive completions (their SRQ WQEs are
  // free again, as mlx5's cq_clean frees them).
  uint32_t purge_qp(uint32_t qpn);
  // Called by the progress thread for a notification from another process.
  void on_remote_notify();
  void on_overrun();

  Context& context() { return context_; }
  CompletionChannel* channel() { return channel_; }
  int cqe() const { return cqe_; }  // what the CQ reports (queue_sizes.hpp), not what was asked
  uint32_t id() const { return id_; }
  // Which CQ of this process the id names now (ids are reused; serials are not).
  uint32_t serial() const { return serial_; }
  uint64_t shared_offset() const { return shared_offset_; }
  host::SharedCq* shared() const { return shared_; }

  void* handle = nullptr;          // the application's ibv_cq
  EventCounters comp_events;       // completion-channel events given out / acked
  EventCounters async_events;

  void attach(QueuePair* qp);
  // An XRC SRQ whose receive completions come here: polling one frees its slot.
  void attach_xrc_srq(SharedReceiveQueue* srq);
  void detach_xrc_srq(SharedReceiveQueue* srq);
  void detach(QueuePair* qp);
  // Runs `f` under the poll lock. A poll retires WQE slots of its QPs under
  // it (QueuePair::retire_send/retire_recv, plain stores); a QP's reset
  // rewrites those counts through here, so that the two never interleave.
  template <class F>
  void run_locked(F&& f) {
    std::lock_guard guard(poll_lock_);
    f();
  }
  // detach() for a QP's receive CQ: also counts the receive completions of the
  // QP still in the ring, which no poll will retire any more (their SRQ WQEs
  // are the destroyed QP's to give back). One step under the poll lock, so
  // that no completion is counted and retired both.
  uint32_t detach_counting_receives(QueuePair* qp);
  bool in_use();

 private:
  CompletionQueue(Context& context, int cqe, CompletionChannel* channel)
      : context_(context), channel_(channel), cqe_(cqe) {}
  void signal_channel();

  Context& context_;
  CompletionChannel* channel_;
  int cqe_;
  uint32_t id_ = 0;
  uint32_t serial_ = 0;
  bool counted_ = false;  // holds a unit of the node's cq_quota()
  // Allocates and zeroes a ring of `capacity` slots; nullptr when the segment is full.
  host::CqRing* allocate_ring(uint32_t capacity, uint64_t& offset, uint64_t& bytes);

  uint64_t shared_offset_ = 0;
  host::SharedCq* shared_ = nullptr;
  host::CqRing* ring_ = nullptr;  // the current ring (consumer side)
  struct RingBlock {
    uint64_t offset;
    uint64_t bytes;
  };
  RingBlock ring_block_{};  // the current ring's memory
  // Rings replaced by resize that a producer may still be reading (it loaded
  // the offset before the switch); freed once no producer is inside push().
  std::vector<RingBlock> retired_rings_;  // guarded by poll_lock_
  void free_retired_rings_locked();
  // The udp link's packets, received by a poller that found the ring empty
  // with `guard` (the poll lock) off. True when the link looked, the lock
  // taken again; false, the lock left off, when it had nothing to look at.
  bool receive_while_empty(std::unique_lock<BiasedLock<SpinLock>>& guard);
  void detach_locked(QueuePair* qp);
  bool pop_locked(host::Cqe& out);
  // Frees the queue slot of a polled completion's WQE (QueuePair::retire_*).
  // Under poll_lock_, which QP destruction takes to detach: the QP cannot
  // go away meanwhile.
  void retire_locked(host::Cqe& cqe);
  // Receive completions of `qpn` in the ring not yet polled nor purged (under poll_lock_).
  uint32_t count_receives_locked(uint32_t qpn);
  struct Purge {
    uint32_t qpn;
    uint64_t until;  // ring positions below this were produced before the reset
  };
  // Whether the completion at `position` is one of a reset QP `qpn` (under poll_lock_).
  bool purged_locked(uint64_t position, uint32_t qpn) const;
  // Removes purged completions from the published part of the ring (under poll_lock_).
  void compact_locked();
  // Biased: the thread that polls alone takes it without a locked instruction.
  BiasedLock<SpinLock> poll_lock_;
  std::vector<Purge> purges_;  // guarded by poll_lock_
  // The QPs feeding this CQ, by QPN; guarded by poll_lock_ (one lock per
  // poll: a second one, for this map alone, cost two more locked
  // instructions per ibv_poll_cq).
  std::unordered_map<uint32_t, QueuePair*> users_;
  // The user the last completion named (most CQs are fed by one QP, or by
  // a few in turn): a hash lookup per poll cost as much as the CQ's ring.
  // Cleared whenever users_ changes. Under poll_lock_.
  QueuePair* last_user_ = nullptr;
  uint32_t last_user_qpn_ = 0;
  QueuePair* user_locked(uint32_t qpn);
  std::unordered_map<uint32_t, SharedReceiveQueue*> xrc_srqs_;  // by the SRQ's id (under poll_lock_)
  std::atomic<bool> error_raised_{false};
};

}  // namespace softhca::engine
