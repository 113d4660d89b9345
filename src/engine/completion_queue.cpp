#include "engine/completion_queue.hpp"

#include <algorithm>
#include <bit>

#include "common/log.hpp"
#include "engine/completion_channel.hpp"
#include "engine/limits.hpp"
#include "engine/qp/queue_pair.hpp"

namespace softhca::engine {

Result<CompletionQueue*> CompletionQueue::create(Context& context, int cqe, CompletionChannel* channel) {
  if (cqe < 1 || cqe > limits::kMaxCqe) return fail(std::errc::invalid_argument);
  Node& node = context.node();
  auto* cq = new CompletionQueue(context, cqe, channel);
  // The ring holds `capacity` entries and overruns past that: round cqe up to a
  // power of two, no further (bit_ceil(cqe + 1) let a CQ of 4 take 8 completions
  // without overrun, where hardware that reports 4 would raise CQ_ERR).
  const uint32_t capacity = std::bit_ceil(static_cast<uint32_t>(cqe));
  cq->shared_bytes_ = shm::SharedCq::bytes_for(capacity);
  cq->shared_offset_ = node.segment().allocate(cq->shared_bytes_);
  if (cq->shared_offset_ == 0) {
    delete cq;
    return fail(std::errc::not_enough_memory);
  }
  cq->shared_ = node.segment().at<shm::SharedCq>(cq->shared_offset_);
  cq->shared_->capacity = capacity;
  cq->shared_->owner_proc = node.proc();
  cq->id_ = node.cqs().add(cq);
  cq->shared_->owner_cq_id = cq->id_;
  if (channel) channel->attach();
  return cq;
}

CompletionQueue::~CompletionQueue() {
  Node& node = context_.node();
  if (id_ != 0) node.cqs().remove(id_);
  if (channel_) {
    channel_->forget(*this);
    channel_->detach();
  }
  if (shared_offset_) node.segment().release(shared_offset_, shared_bytes_);
}

void CompletionQueue::attach(QueuePair* qp) {
  std::lock_guard guard(users_mutex_);
  users_.push_back(qp);
}

void CompletionQueue::detach(QueuePair* qp) {
  std::lock_guard guard(users_mutex_);
  users_.erase(std::remove(users_.begin(), users_.end(), qp), users_.end());
}

bool CompletionQueue::in_use() {
  std::lock_guard guard(users_mutex_);
  return !users_.empty();
}

std::vector<QueuePair*> CompletionQueue::users() {
  std::lock_guard guard(users_mutex_);
  return users_;
}

namespace {

void to_wc(const shm::Cqe& c, ibv_wc& wc) {
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
}

}  // namespace

bool CompletionQueue::pop_locked(shm::Cqe& out) {
  for (;;) {
    const uint64_t position = shared_->tail.load(std::memory_order_relaxed);
    if (!shared_->pop(out)) return false;
    if (purges_.empty()) return true;
    bool drop = false;
    for (const Purge& p : purges_) drop |= position < p.until && out.qp_num == p.qpn;
    std::erase_if(purges_, [&](const Purge& p) { return position + 1 >= p.until; });
    if (!drop) return true;
  }
}

void CompletionQueue::purge_qp(uint32_t qpn) {
  std::lock_guard guard(poll_lock_);
  const uint64_t until = shared_->head.load(std::memory_order_acquire);
  if (until != shared_->tail.load(std::memory_order_relaxed)) purges_.push_back(Purge{qpn, until});
}

int CompletionQueue::poll(int n, ibv_wc* wc) {
  if (n < 0) return -1;
  Node& node = context_.node();
  if (node.has_waiting()) node.run_timers(Node::now_ns());
  std::lock_guard guard(poll_lock_);
  int got = 0;
  shm::Cqe cqe;
  while (got < n && pop_locked(cqe)) to_wc(cqe, wc[got++]);
  return got;
}

bool CompletionQueue::poll_one(shm::Cqe& out) {
  Node& node = context_.node();
  if (node.has_waiting()) node.run_timers(Node::now_ns());
  std::lock_guard guard(poll_lock_);
  return pop_locked(out);
}

void CompletionQueue::arm(bool solicited_only) {
  shared_->armed.store(solicited_only ? shm::SharedCq::kArmSolicited : shm::SharedCq::kArmNext,
                       std::memory_order_seq_cst);
}

Result<void> CompletionQueue::resize(int cqe) {
  if (cqe < 1 || cqe > limits::kMaxCqe) return fail(std::errc::invalid_argument);
  const uint64_t outstanding = shared_->head.load() - shared_->tail.load();
  if (static_cast<uint64_t>(cqe) < outstanding) return fail(std::errc::invalid_argument);
  // The ring is shared with initiators in other processes that hold its
  // offset; it can shrink or grow within its capacity, not move.
  if (static_cast<uint32_t>(cqe) > shared_->capacity) {
    SOFTHCA_INFO("resize_cq to %d exceeds the ring's capacity %u", cqe, shared_->capacity);
    return fail(std::errc::not_enough_memory);
  }
  cqe_ = cqe;
  return {};
}

void CompletionQueue::signal_channel() {
  if (channel_ == nullptr) return;
  channel_->signal(*this);
}

void CompletionQueue::push(const shm::Cqe& cqe) {
  switch (shared_->push(cqe)) {
    case shm::SharedCq::Push::kOk:
      break;
    case shm::SharedCq::Push::kOkNotify:
      signal_channel();
      break;
    case shm::SharedCq::Push::kOverrun:
      on_overrun();
      break;
  }
}

void CompletionQueue::on_remote_notify() { signal_channel(); }

void CompletionQueue::on_overrun() {
  if (error_raised_.exchange(true)) return;
  SOFTHCA_WARN("cq overrun: more completions than its %d entries; the cq is in error", cqe_);
  context_.raise_async_event(AsyncEvent{IBV_EVENT_CQ_ERR, handle, 0});
}

}  // namespace softhca::engine
