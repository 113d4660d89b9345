#include "engine/completion_queue.hpp"

#include <algorithm>
#include <bit>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "engine/completion_channel.hpp"
#include "common/limits.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/queue_sizes.hpp"
#include "engine/shared_receive_queue.hpp"

namespace softhca::engine {

host::CqRing* CompletionQueue::allocate_ring(uint32_t capacity, uint64_t& offset, uint64_t& bytes) {
  host::ProcessSegment& segment = context_.node().segment();
  bytes = host::CqRing::bytes_for(capacity);
  offset = segment.allocate(bytes);
  if (offset == 0) return nullptr;
  auto* ring = segment.at<host::CqRing>(offset);
  ring->capacity = capacity;
  return ring;
}

Result<CompletionQueue*> CompletionQueue::create(Context& context, int cqe, CompletionChannel* channel,
                                                 bool timestamps) {
  if (cqe < 1 || cqe > limits::kMaxCqe) return fail(std::errc::invalid_argument);
  Node& node = context.node();
  if (!node.cq_quota().try_take()) return fail(std::errc::not_enough_memory);  // at max_cq
  const CqSize size = cq_size_for(static_cast<uint32_t>(cqe));
  auto* cq = new CompletionQueue(context, static_cast<int>(size.reported), channel);
  cq->counted_ = true;
  cq->shared_offset_ = node.segment().allocate(sizeof(host::SharedCq));
  // The ring holds `slots` entries and overruns past that.
  uint64_t ring_offset = 0, ring_bytes = 0;
  host::CqRing* ring = cq->shared_offset_ ? cq->allocate_ring(size.slots, ring_offset, ring_bytes) : nullptr;
  if (ring == nullptr) {
    delete cq;
    return fail(std::errc::not_enough_memory);
  }
  cq->ring_block_ = RingBlock{ring_offset, ring_bytes};
  cq->ring_ = ring;
  cq->shared_ = node.segment().at<host::SharedCq>(cq->shared_offset_);
  cq->shared_->owner_proc = node.proc();
  cq->shared_->stamp_completions = timestamps ? 1 : 0;
  cq->shared_->has_channel = channel != nullptr ? 1 : 0;
  // The serial before the id: once in the table, the CQ is the progress
  // thread's to find (Node::on_event reads the serial there).
  cq->serial_ = node.next_serial();
  cq->shared_->owner_serial = cq->serial_;
  cq->id_ = node.cqs().add(cq);
  cq->shared_->owner_cq_id = cq->id_;
  cq->shared_->ring_offset.store(ring_offset, std::memory_order_release);
  if (channel) channel->attach();
  return cq;
}

CompletionQueue::~CompletionQueue() {
  Node& node = context_.node();
  if (id_ != 0) node.cqs().remove(id_);
  // What a relay raised after ibv_destroy_cq's forget_events (see ~QueuePair).
  if (handle != nullptr) context_.forget_events(handle);
  if (channel_) {
    channel_->forget(*this);
    channel_->detach();
  }
  // No QP feeds a CQ that is being destroyed, so no producer is left in any ring.
  for (const RingBlock& block : retired_rings_) node.segment().release(block.offset, block.bytes);
  if (ring_block_.bytes) node.segment().release(ring_block_.offset, ring_block_.bytes);
  if (shared_offset_) node.segment().release(shared_offset_, sizeof(host::SharedCq));
  if (counted_) node.cq_quota().give_back();
}

void CompletionQueue::attach(QueuePair* qp) {
  std::lock_guard guard(poll_lock_);
  users_[qp->qpn()] = qp;
  last_user_ = nullptr;
}

void CompletionQueue::detach(QueuePair* qp) {
  std::lock_guard guard(poll_lock_);
  detach_locked(qp);
}

void CompletionQueue::detach_locked(QueuePair* qp) {
  if (auto it = users_.find(qp->qpn()); it != users_.end() && it->second == qp) users_.erase(it);
  if (last_user_ == qp) last_user_ = nullptr;
}

QueuePair* CompletionQueue::user_locked(uint32_t qpn) {
  if (last_user_ != nullptr && last_user_qpn_ == qpn) return last_user_;
  auto it = users_.find(qpn);
  if (it == users_.end()) return nullptr;
  last_user_qpn_ = qpn;
  last_user_ = it->second;
  return last_user_;
}

void CompletionQueue::attach_xrc_srq(SharedReceiveQueue* srq) {
  std::lock_guard guard(poll_lock_);
  xrc_srqs_[srq->id()] = srq;
}

void CompletionQueue::detach_xrc_srq(SharedReceiveQueue* srq) {
  std::lock_guard guard(poll_lock_);
  if (auto it = xrc_srqs_.find(srq->id()); it != xrc_srqs_.end() && it->second == srq) xrc_srqs_.erase(it);
}

void CompletionQueue::retire_locked(host::Cqe& cqe) {
  if (cqe.wc_flags & IBV_WC_WITH_INV) {
    // A SEND WITH INVALIDATE invalidated one of our windows, in whichever
    // process ran the responder, before this completion was written. The
    // application learns it here: an access that validated the key before
    // it went must be over first, as after ibv_dereg_mr.
    Node& node = context_.node();
    node.registry().fence_accesses(node.proc());
  }
  if (cqe.flags & host::kCqeNoWqe) return;  // tag matching: no queue slot to free
  if (cqe.flags & host::kCqeXrcSrq) {
    const uint32_t srq_id = cqe.vendor_err;
    cqe.vendor_err = 0;
    if (auto it = xrc_srqs_.find(srq_id); it != xrc_srqs_.end()) it->second->retire();
    return;
  }
  const bool send = (cqe.flags & host::kCqeSendPosition) != 0;
  const uint32_t position = cqe.src_qp;
  if (send) cqe.src_qp = 0;  // not a field of send completions
  QueuePair* qp = user_locked(cqe.qp_num);
  if (qp == nullptr) return;  // the QP is gone
  if (send) {
    qp->retire_send(position);
  } else if (cqe.opcode & IBV_WC_RECV) {
    const bool known = (cqe.flags & host::kCqeRecvPosition) != 0;
    qp->retire_recv(known ? &cqe.vendor_err : nullptr);
    if (known) cqe.vendor_err = 0;  // not a field of this completion
  }
}

bool CompletionQueue::in_use() {
  std::lock_guard guard(poll_lock_);
  return !users_.empty() || !xrc_srqs_.empty();
}


namespace {

void to_wc(const host::Cqe& c, ibv_wc& wc) {
  wc.wr_id = c.wr_id;
  wc.status = static_cast<ibv_wc_status>(c.status);
  wc.opcode = static_cast<ibv_wc_opcode>(c.opcode);
  wc.vendor_err = c.vendor_err;
  wc.byte_len = c.byte_len;
  wc.imm_data = c.imm_data;
  wc.qp_num = c.qp_num;
  wc.src_qp = c.src_qp;
  wc.wc_flags = c.wc_flags;
  wc.pkey_index = c.pkey_index;
  wc.slid = c.slid;
  wc.sl = c.sl;
  wc.dlid_path_bits = c.dlid_path_bits;
  if (c.flags & host::kCqeTmInfo) {  // those fields carry the tag (ibv_wc has no room for it)
    wc.vendor_err = 0;
    wc.src_qp = 0;
    wc.imm_data = 0;
  }
}

}  // namespace

bool CompletionQueue::pop_locked(host::Cqe& out) {
  for (;;) {
    const uint64_t position = ring_->tail.load(std::memory_order_relaxed);
    if (!ring_->pop(out)) return false;
    if (purges_.empty()) return true;
    const bool drop = purged_locked(position, out.qp_num);
    std::erase_if(purges_, [&](const Purge& p) { return position + 1 >= p.until; });
    if (!drop) return true;
  }
}

uint32_t CompletionQueue::count_receives_locked(uint32_t qpn) {
  const uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  const uint64_t head = ring_->head.load(std::memory_order_acquire) & ~host::CqRing::kClosed;
  uint32_t count = 0;
  for (uint64_t position = tail; position < head; ++position) {
    host::CqSlot& slot = ring_->slot(position);
    if (slot.seq.load(std::memory_order_acquire) != position + 1) continue;
    if (slot.cqe.qp_num != qpn || !(slot.cqe.opcode & IBV_WC_RECV) || (slot.cqe.flags & host::kCqeNoWqe)) continue;
    if (!purged_locked(position, qpn)) ++count;
  }
  return count;
}

bool CompletionQueue::purged_locked(uint64_t position, uint32_t qpn) const {
  for (const Purge& p : purges_)
    if (position < p.until && qpn == p.qpn) return true;
  return false;
}

uint32_t CompletionQueue::purge_qp(uint32_t qpn) {
  std::lock_guard guard(poll_lock_);
  const uint32_t receives = count_receives_locked(qpn);
  const uint64_t until = ring_->head.load(std::memory_order_acquire) & ~host::CqRing::kClosed;
  if (until != ring_->tail.load(std::memory_order_relaxed)) purges_.push_back(Purge{qpn, until});
  compact_locked();
  return receives;
}

// mlx5 cleans a reset QP's CQEs out of its CQ (cq_clean), so their room is
// free at once; here the published ones leave the ring, and those a
// producer is still writing are skipped when polled.
void CompletionQueue::compact_locked() {
  if (purges_.empty()) return;
  const uint64_t published = ring_->remove_published_if(
      [&](uint64_t position, const host::Cqe& c) { return purged_locked(position, c.qp_num); });
  // Purges that reached no further than the published part are done.
  std::erase_if(purges_, [&](const Purge& p) { return p.until <= published; });
}

uint32_t CompletionQueue::detach_counting_receives(QueuePair* qp) {
  std::lock_guard poll(poll_lock_);
  detach_locked(qp);
  return count_receives_locked(qp->qpn());
}

int CompletionQueue::poll(int n, ibv_wc* wc) {
  if (n < 0) return -1;
  Node& node = context_.node();
  if (node.has_waiting()) node.run_timers(monotonic_ns());
  std::unique_lock guard(poll_lock_);
  if (ring_->empty() && (!receive_while_empty(guard) || ring_->empty())) return 0;
  if (n == 0) return 0;
  int got = 0;
  host::Cqe cqe;
  while (got < n && pop_locked(cqe)) {
    retire_locked(cqe);
    to_wc(cqe, wc[got++]);
  }
  return got;
}

bool CompletionQueue::poll_one(host::Cqe& out) {
  Node& node = context_.node();
  if (node.has_waiting()) node.run_timers(monotonic_ns());
  std::unique_lock guard(poll_lock_);
  if (ring_->empty() && !receive_while_empty(guard)) return false;
  if (!pop_locked(out)) return false;
  retire_locked(out);
  return true;
}

// Packets that arrived for this process are processed by the polling
// thread itself when the CQ is empty: a busy-polling application would
// otherwise leave the udp link's thread waiting for a core. Asked under the
// poll lock (a resize in another thread replaces, then frees, the ring),
// received outside it: receiving completes into CQs, this one included.
// True with the lock taken again when the link looked for packets; false,
// the lock left off, when it had nothing to look at.
bool CompletionQueue::receive_while_empty(std::unique_lock<BiasedLock<SpinLock>>& guard) {
  guard.unlock();
  if (!context_.node().udp_link().poll()) return false;
  guard.lock();
  return true;
}

void CompletionQueue::arm(bool solicited_only) {
  shared_->armed.store(solicited_only ? host::SharedCq::kArmSolicited : host::SharedCq::kArmNext,
                       std::memory_order_seq_cst);
  // seq_cst, as the poll's reads of the ring after it (CqRing::pop): see
  // host::SharedCq::push_to_ring.
  // The thread will sleep until the event: packets it would have received
  // in poll() are the link thread's again.
  context_.node().udp_link().pollers_rest();
}

Result<void> CompletionQueue::resize(int cqe) {
  if (cqe < 1 || cqe > limits::kMaxCqe) return fail(std::errc::invalid_argument);
  std::lock_guard guard(poll_lock_);
  const uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  const CqSize size = cq_size_for(static_cast<uint32_t>(cqe));
  const uint32_t capacity = size.slots;
  if (capacity == ring_->capacity) {
    if (static_cast<uint64_t>(cqe) < ring_->head.load(std::memory_order_acquire) - tail)
      return fail(std::errc::invalid_argument);
    cqe_ = static_cast<int>(size.reported);
    return {};
  }
  uint64_t offset = 0, bytes = 0;
  host::CqRing* next = allocate_ring(capacity, offset, bytes);
  if (next == nullptr) return fail(std::errc::not_enough_memory);
  // Close the old ring: from here no producer can reserve in it; those that
  // already did publish within moments (they hold no lock and never block).
  const uint64_t head = ring_->head.fetch_or(host::CqRing::kClosed, std::memory_order_acq_rel);
  const uint64_t held = head - tail;
  if (held > capacity || held > static_cast<uint64_t>(cqe)) {
    // It would not fit: reopen the old ring and refuse, as the verbs do.
    ring_->head.fetch_and(~host::CqRing::kClosed, std::memory_order_acq_rel);
    context_.node().segment().release(offset, bytes);
    return fail(std::errc::invalid_argument);
  }
  uint64_t copied = 0;
  for (uint64_t position = tail; position < head; ++position) {
    host::CqSlot& from = ring_->slot(position);
    const uint64_t deadline = monotonic_ns() + 100'000'000;
    while (from.seq.load(std::memory_order_acquire) != position + 1 && monotonic_ns() < deadline)
      __builtin_ia32_pause();
    if (from.seq.load(std::memory_order_acquire) != position + 1) {
      // Reserved and never published: its producer died inside push (or
      // stalled for longer than any push takes). What the slot holds is an
      // older completion; copying it would report that one twice.
      SOFTHCA_WARN("cq resize: a completion reserved by a producer that never published it is dropped");
      continue;
    }
    if (purged_locked(position, from.cqe.qp_num)) continue;  // a reset QP's: not carried over
    host::CqSlot& to = next->slot(copied);
    to.cqe = from.cqe;
    to.seq.store(copied + 1, std::memory_order_relaxed);
    ++copied;
  }
  next->head.store(copied, std::memory_order_relaxed);
  purges_.clear();  // every purge ended below the closed head
  retired_rings_.push_back(ring_block_);
  ring_block_ = RingBlock{offset, bytes};
  ring_ = next;
  shared_->ring_offset.store(offset, std::memory_order_seq_cst);
  cqe_ = static_cast<int>(size.reported);
  free_retired_rings_locked();
  return {};
}

void CompletionQueue::free_retired_rings_locked() {
  // Producers leave push() within moments (they never block), unless one
  // died inside it: then the rings stay until the CQ is destroyed. Those of
  // this process that pushed under an access announcement are waited for
  // by the announcement.
  context_.node().registry().fence_accesses(context_.node().proc());
  const uint64_t deadline = monotonic_ns() + 1'000'000;
  while (!shared_->quiescent()) {
    if (monotonic_ns() > deadline) return;
    __builtin_ia32_pause();
  }
  for (const RingBlock& block : retired_rings_) context_.node().segment().release(block.offset, block.bytes);
  retired_rings_.clear();
}

void CompletionQueue::signal_channel() {
  if (channel_ == nullptr) return;
  channel_->signal(*this);
}

void CompletionQueue::push(const host::Cqe& cqe) {
  Node& node = context_.node();
  host::HostRegistry& registry = node.registry();
  const uint32_t self = node.proc();
  host::SharedCq::Push pushed;
  // Under the thread's own announcement when it has one free: two locked
  // instructions fewer than counting in `pushers` (free_retired_rings_locked).
  if (const uint32_t slot = registry.try_begin_owned_access(self, self); slot != host::HostRegistry::kNoAccessSlot) {
    pushed = shared_->push_announced(node.segment().base(), cqe);
    registry.end_access(self, slot);
  } else {
    pushed = shared_->push(node.segment().base(), cqe);
  }
  switch (pushed) {
    case host::SharedCq::Push::kOk:
      break;
    case host::SharedCq::Push::kOkNotify:
      signal_channel();
      break;
    case host::SharedCq::Push::kOverrun:
      on_overrun();
      break;
  }
}

void CompletionQueue::on_remote_notify() { signal_channel(); }

void CompletionQueue::on_overrun() {
  // A relayed overrun of a CQ destroyed meanwhile reaches the CQ that got
  // its id: only a ring that did overrun reports one.
  if (shared_->overrun.load(std::memory_order_acquire) == 0) return;
  if (error_raised_.exchange(true)) return;
  SOFTHCA_WARN("cq overrun: more completions than its %d entries; the cq is in error", cqe_);
  context_.raise_async_event(AsyncEvent{IBV_EVENT_CQ_ERR, handle, 0});
}

}  // namespace softhca::engine
