#include "engine/shared_receive_queue.hpp"

#include <bit>

#include "common/limits.hpp"
#include "engine/completion_queue.hpp"
#include "engine/protection_domain.hpp"
#include "engine/xrc_domain.hpp"
#include "engine/queue_sizes.hpp"
#include "host/process_identity.hpp"
#include "transport/tag_matching.hpp"

namespace softhca::engine {

Result<SharedReceiveQueue*> SharedReceiveQueue::create(ProtectionDomain& pd, uint32_t max_wr, uint32_t max_sge,
                                                       uint32_t limit, XrcSrqInit xrc, TmSrqInit tm) {
  if ((xrc.xrcd == nullptr) != (xrc.cq == nullptr)) return fail(std::errc::invalid_argument);
  if (tm.cq != nullptr && (xrc.xrcd != nullptr || tm.max_num_tags == 0 || tm.max_num_tags > limits::kTmMaxNumTags ||
                           tm.max_ops == 0 || tm.max_ops > limits::kTmMaxOps))
    return fail(std::errc::invalid_argument);
  if (max_wr == 0 || max_wr > static_cast<uint32_t>(limits::kMaxSrqWr) || max_sge == 0 ||
      max_sge > static_cast<uint32_t>(limits::kMaxSrqSge) || limit > max_wr)
    return fail(std::errc::invalid_argument);
  Node& node = pd.context().node();
  if (!node.srq_quota().try_take()) return fail(std::errc::not_enough_memory);  // at max_srq
  auto* srq = new SharedReceiveQueue(pd);
  srq->counted_ = true;
  srq->max_wr_ = srq_size_for(max_wr);
  srq->max_sge_ = max_sge;
  // The sizes ConnectX has for it (one WQE spare: what modify may grow
  // max_wr to), in a ring with slots to spare beyond them.
  srq->resize_limit_ = std::bit_ceil(srq->max_wr_);
  const uint32_t capacity = recv_ring_slots_for(srq->resize_limit_);
  srq->shared_bytes_ = host::SharedRq::bytes_for(capacity, max_sge);
  srq->shared_offset_ = node.segment().allocate(srq->shared_bytes_);
  if (srq->shared_offset_ == 0) {
    delete srq;
    return fail(std::errc::not_enough_memory);
  }
  srq->shared_ = node.segment().at<host::SharedRq>(srq->shared_offset_);
  srq->shared_->capacity = capacity;
  srq->shared_->max_sge = max_sge;
  srq->shared_->stride = host::SharedRq::stride_for(max_sge);
  srq->shared_->owner_proc = node.proc();
  srq->shared_->pd_id = pd.id();
  // The serial before the id: once in the table, the SRQ is the progress
  // thread's to find (Node::on_event reads the serial there).
  srq->serial_ = node.next_serial();
  srq->shared_->owner_serial = srq->serial_;
  srq->id_ = node.srqs().add(srq);
  srq->shared_->owner_srq_id = srq->id_;
  srq->shared_->limit.store(limit, std::memory_order_release);
  pd.attach();
  if (tm.cq != nullptr) {
    // The list lives next to the ring, where initiators in any process of
    // the host match against it (ShmResponderPort::tag_list).
    srq->tag_list_bytes_ = transport::TagList::bytes_for(tm.max_num_tags);
    srq->tag_list_offset_ = node.segment().allocate(srq->tag_list_bytes_);
    if (srq->tag_list_offset_ == 0) {
      delete srq;
      return fail(std::errc::not_enough_memory);
    }
    srq->tag_list_ = transport::TagList::init(node.segment().at<char>(srq->tag_list_offset_), tm.max_num_tags);
    srq->tm_ = tm;
    // Held as an XRC SRQ holds its CQ: the CQ cannot be destroyed first.
    tm.cq->attach_xrc_srq(srq);
    srq->shared_->tag_list_offset = srq->tag_list_offset_;
  }
  if (xrc.xrcd != nullptr) {
    // Published like a QP, under a number of the QPN space, as a record that
    // no message can use as a QP (shm_port's select_xrc_srq reads it).
    srq->record_offset_ = node.segment().allocate(sizeof(host::SharedQp));
    if (srq->record_offset_ == 0) {
      delete srq;
      return fail(std::errc::not_enough_memory);
    }
    host::SharedQp& record = *node.segment().at<host::SharedQp>(srq->record_offset_);
    record.qp_type = host::SharedQp::kXrcSrqRecord;
    record.owner_proc = node.proc();
    record.owner_qp_id = srq->id_;
    record.pd_id = pd.id();
    record.xrcd_id = xrc.xrcd->id();
    record.srq_offset = srq->shared_offset_;
    record.recv_cq_offset = xrc.cq->shared_offset();
    record.state.store(IBV_QPS_RESET, std::memory_order_release);
    auto number = node.registry().allocate_qpn(node.proc(), srq->record_offset_);
    if (!number) {
      delete srq;
      return fail(number.error());
    }
    srq->srq_num_ = *number;
    record.qpn = *number;
    srq->xrc_ = xrc;
    xrc.xrcd->attach();
    xrc.cq->attach_xrc_srq(srq);
    node.registry().publish_qp(srq->srq_num_);
  }
  return srq;
}

SharedReceiveQueue::~SharedReceiveQueue() {
  Node& node = pd_.context().node();
  if (srq_num_ != 0) {
    // As a QP's destructor: no initiator reaches the ring once the number is
    // released and the accesses that may have found it are over.
    node.registry().release_qpn(srq_num_);
    node.registry().fence_accesses(node.proc());
  }
  if (xrc_.xrcd != nullptr) {
    xrc_.cq->detach_xrc_srq(this);
    xrc_.xrcd->detach();
  }
  if (tm_.cq != nullptr) tm_.cq->detach_xrc_srq(this);
  if (tag_list_offset_) node.segment().release(tag_list_offset_, tag_list_bytes_);
  if (record_offset_) node.segment().release(record_offset_, sizeof(host::SharedQp));
  if (id_) node.srqs().remove(id_);
  // What a relay raised after ibv_destroy_srq's forget_events (see ~QueuePair).
  if (handle != nullptr) pd_.context().forget_events(handle);
  if (shared_offset_) node.segment().release(shared_offset_, shared_bytes_);
  if (counted_) node.srq_quota().give_back();
  if (shared_) pd_.detach();
}

Result<void> SharedReceiveQueue::post(uint64_t wr_id, const host::RecvSge* sges, uint32_t num_sge) {
  if (num_sge > max_sge_) return fail(std::errc::invalid_argument);
  // sg_list may be nullptr when num_sge is 0; push memcpys from it (undefined for nullptr).
  static constexpr host::RecvSge kNoSge{};
  if (num_sge == 0) sges = &kNoSge;
  std::lock_guard guard(post_mutex_);
  // A slot is taken from post until its completion is polled.
  const uint64_t retired = retired_.load(std::memory_order_acquire);
  if (shared_->head.load(std::memory_order_relaxed) - retired >= max_wr_ || !shared_->push(wr_id, sges, num_sge, retired))
    return fail(std::errc::not_enough_memory);
  return {};
}

Result<void> SharedReceiveQueue::modify(uint32_t max_wr, uint32_t limit, int mask) {
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return fail(std::errc::invalid_argument);
  if (mask & IBV_SRQ_MAX_WR) {
    // The ring is shared and cannot move; it resizes within what it was
    // sized for.
    if (max_wr == 0 || max_wr >= resize_limit_ ||
        max_wr < shared_->head.load(std::memory_order_acquire) - retired_.load(std::memory_order_acquire))
      return fail(std::errc::invalid_argument);
  }
  const uint32_t new_max = (mask & IBV_SRQ_MAX_WR) ? max_wr : max_wr_;
  if ((mask & IBV_SRQ_LIMIT) && limit > new_max) return fail(std::errc::invalid_argument);
  max_wr_ = new_max;
  if (mask & IBV_SRQ_LIMIT) shared_->limit.store(limit, std::memory_order_release);
  return {};
}

void SharedReceiveQueue::query(uint32_t& max_wr, uint32_t& max_sge, uint32_t& limit) const {
  max_wr = max_wr_;
  max_sge = max_sge_;
  limit = shared_->limit.load(std::memory_order_acquire);
}

void SharedReceiveQueue::retire(uint32_t count) { host::SharedRq::retire(retired_, shared_->tail, count); }

Result<void> SharedReceiveQueue::post_tag_op(TagOp& op) {
  if (tag_list_ == nullptr) return fail(std::errc::operation_not_supported);
  if (op.flags & ~uint32_t{IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC}) return fail(std::errc::invalid_argument);
  ibv_wc_opcode opcode = IBV_WC_TM_SYNC;
  ibv_wc_status status = IBV_WC_SUCCESS;
  // A sender killed while it matched leaves its pid in the list's lock.
  const transport::LockTaker me{host::self_pid(), &host::pid_alive};
  switch (op.opcode) {
    case IBV_WR_TAG_ADD: {
      static_assert(sizeof(host::RecvSge) == sizeof(transport::ReceiveSge));
      auto handle = tag_list_->add(op.tag, op.mask, op.recv_wr_id,
                                   reinterpret_cast<const transport::ReceiveSge*>(op.sges), op.num_sge, me);
      if (!handle) return fail(handle.error());
      op.handle = *handle;
      opcode = IBV_WC_TM_ADD;
      break;
    }
    case IBV_WR_TAG_DEL:
      opcode = IBV_WC_TM_DEL;
      if (!tag_list_->remove(op.handle, me)) status = IBV_WC_TM_ERR;  // consumed meanwhile, or never there
      break;
    case IBV_WR_TAG_SYNC:
      break;
    default:
      return fail(std::errc::invalid_argument);
  }
  if (op.flags & IBV_OPS_TM_SYNC) tag_list_->report(op.unexpected_cnt, me);
  if ((op.flags & IBV_OPS_SIGNALED) || status != IBV_WC_SUCCESS) {
    host::Cqe cqe{};
    cqe.wr_id = op.wr_id;
    cqe.status = status;
    cqe.opcode = opcode;
    cqe.flags = host::kCqeNoWqe;
    // Still out of step after this operation: software has unexpected
    // messages to handle and report before matching resumes.
    if (!tag_list_->in_sync(me)) cqe.wc_flags = IBV_WC_TM_SYNC_REQ;
    tm_.cq->push(cqe);
  }
  return {};
}

void SharedReceiveQueue::on_limit_reached() {
  pd_.context().raise_async_event(AsyncEvent{IBV_EVENT_SRQ_LIMIT_REACHED, handle, 0});
}

}  // namespace softhca::engine
