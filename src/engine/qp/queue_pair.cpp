#include "engine/qp/queue_pair.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "engine/address_handle.hpp"
#include "engine/completion_queue.hpp"
#include "engine/device/device_info.hpp"
#include "common/limits.hpp"
#include "engine/memory_region.hpp"
#include "engine/memory_window.hpp"
#include "engine/protection_domain.hpp"
#include "engine/queue_sizes.hpp"
#include "engine/shared_receive_queue.hpp"
#include "engine/xrc_domain.hpp"
#include "common/settings.hpp"

namespace softhca::engine {
namespace {

// Ring storage: a power of two, never empty (a queue of 0 WRs refuses every post).
uint32_t ring_capacity(uint32_t wanted) { return std::bit_ceil(wanted < 1 ? 1u : wanted); }

// A start for a QP's send queue positions that differs from one QP to the next.
uint32_t random_start(uint32_t qpn) {
  uint64_t x = monotonic_ns() ^ (uint64_t{qpn} << 32);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

ibv_wc_opcode wc_opcode_for(uint32_t wr_opcode) {
  switch (wr_opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE:
      return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;
  }
}

bool opcode_allowed(ibv_qp_type type, uint32_t opcode) {
  switch (type) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_SEND:
      return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM || opcode == IBV_WR_RDMA_WRITE ||
             opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_RDMA_READ ||
             opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
             opcode == IBV_WR_SEND_WITH_INV || opcode == IBV_WR_BIND_MW || opcode == IBV_WR_LOCAL_INV;
    case IBV_QPT_UC:
      // Memory windows bind and invalidate on UC too; SEND WITH INVALIDATE is RC's.
      return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM || opcode == IBV_WR_RDMA_WRITE ||
             opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_BIND_MW || opcode == IBV_WR_LOCAL_INV;
    case IBV_QPT_UD:
      return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM;
    case IBV_QPT_RAW_PACKET:
      // A frame has no immediate data: SEND only (no TSO offered).
      return opcode == IBV_WR_SEND;
    default:
      return false;
  }
}

}  // namespace

QueuePair::QueuePair(ProtectionDomain* pd, Context& context, const QpInitAttr& init)
    : pd_(pd), context_(context), node_(context.node()), init_(init) {
  for (uint32_t opcode = 0; opcode < 32; ++opcode)
    if (opcode_allowed(init_.type, opcode)) send_opcodes_ |= 1u << opcode;
  constexpr auto bit = [](ibv_wr_opcode opcode) { return 1u << opcode; };
  if (init_.type != IBV_QPT_UD && init_.max_send_sge >= 1)
    common_opcodes_ = send_opcodes_ & ~(bit(IBV_WR_BIND_MW) | bit(IBV_WR_LOCAL_INV) | bit(IBV_WR_ATOMIC_WRITE));
  common_inline_opcodes_ =
      common_opcodes_ & ~(bit(IBV_WR_RDMA_READ) | bit(IBV_WR_ATOMIC_CMP_AND_SWP) | bit(IBV_WR_ATOMIC_FETCH_AND_ADD));
}

// max_qp is the registry's QPN table: creating one more QP than that anywhere
// on the host fails in allocate_qpn with not_enough_memory (ENOMEM).
static_assert(limits::kMaxQp == host::kMaxQpSlots, "max_qp must be what the host registry holds");

Result<QueuePair*> QueuePair::create(Context& context, ProtectionDomain* pd, QpInitAttr& init) {
  const bool xrc_send = init.type == IBV_QPT_XRC_SEND;
  const bool xrc_recv = init.type == IBV_QPT_XRC_RECV;
  const bool rss = !init.rss_spread.empty();
  if (init.type != IBV_QPT_RC && init.type != IBV_QPT_UC && init.type != IBV_QPT_UD &&
      init.type != IBV_QPT_RAW_PACKET && !xrc_send && !xrc_recv)
    return fail(std::errc::operation_not_supported);
  if (xrc_recv) {
    // A TGT QP: only its domain; it sends nothing and receives into the SRQs
    // its messages name.
    if (init.xrcd == nullptr) return fail(std::errc::invalid_argument);
    pd = nullptr;
    init.send_cq = init.recv_cq = nullptr;
    init.srq = nullptr;
    init.max_send_wr = init.max_recv_wr = init.max_send_sge = init.max_recv_sge = init.max_inline_data = 0;
  } else {
    init.xrcd = nullptr;
    if (rss && init.type != IBV_QPT_RAW_PACKET) return fail(std::errc::invalid_argument);
    if (pd == nullptr || (init.send_cq == nullptr && !rss)) return fail(std::errc::invalid_argument);
    if (rss) {
      // Receives only, into its work queues: no send or receive queue.
      init.send_cq = init.recv_cq = nullptr;
      init.srq = nullptr;
      init.max_send_wr = init.max_recv_wr = init.max_recv_sge = init.max_inline_data = 0;
    } else if (xrc_send) {
      // An INI QP receives nothing: no receive queue, CQ or SRQ.
      init.recv_cq = nullptr;
      init.srq = nullptr;
      init.max_recv_wr = init.max_recv_sge = 0;
    } else if (init.recv_cq == nullptr) {
      return fail(std::errc::invalid_argument);
    }
  }
  // A tag matching SRQ parses the TM header of RC messages only (IBV_TM_CAP_RC).
  if (init.srq != nullptr && init.srq->tag_list() != nullptr && init.type != IBV_QPT_RC)
    return fail(std::errc::operation_not_supported);
  const bool has_rq = init.srq == nullptr && !xrc_send && !xrc_recv && !rss;
  if (init.max_send_wr > static_cast<uint32_t>(limits::kMaxQpWr) ||
      init.max_send_sge > static_cast<uint32_t>(limits::kMaxSge) ||
      init.max_inline_data > limits::kMaxInlineData ||
      (has_rq && (init.max_recv_wr > static_cast<uint32_t>(limits::kMaxQpWr) ||
                  init.max_recv_sge > static_cast<uint32_t>(limits::kMaxSge))))
    return fail(std::errc::invalid_argument);
  Node& node = context.node();
  // What we grant: at least one of each, so a post never meets a zero-sized queue.
  if (init.max_send_sge == 0 && !xrc_recv) init.max_send_sge = 1;
  if (!has_rq) {
    init.max_recv_wr = 0;
    init.max_recv_sge = 0;
  } else if (init.max_recv_sge == 0) {
    init.max_recv_sge = 1;
  }
  const SendQueueSize send_size =
      send_queue_size_for(init.type, init.max_send_wr, init.max_send_sge, init.max_inline_data);
  init.max_send_wr = send_size.max_send_wr;
  init.max_inline_data = send_size.max_inline_data;
  if (xrc_recv) init.max_send_wr = init.max_inline_data = 0;
  if (has_rq) init.max_recv_wr = recv_queue_size_for(init.max_recv_wr);

  auto* qp = new QueuePair(pd, context, init);
  qp->sq_capacity_ = ring_capacity(init.max_send_wr);
  qp->sq_stride_ = SendWqe::stride_for(init.max_send_sge, init.max_inline_data);
  qp->sq_.assign(uint64_t{qp->sq_capacity_} * qp->sq_stride_, 0);

  if (xrc_recv) {
    // The host's, not this process's (tgt_qp.cpp).
    if (auto made = qp->create_tgt(node); !made) {
      delete qp;
      return fail(made.error());
    }
    init.xrcd->attach();
    qp->attached_ = true;
    return qp;
  }
  host::ProcessSegment& segment = node.segment();
  qp->shared_offset_ = segment.allocate(sizeof(host::SharedQp));
  if (qp->shared_offset_ == 0) {
    delete qp;
    return fail(std::errc::not_enough_memory);
  }
  qp->shared_ = segment.at<host::SharedQp>(qp->shared_offset_);
  if (has_rq) {
    const uint32_t capacity = recv_ring_slots_for(init.max_recv_wr);
    qp->rq_bytes_ = host::SharedRq::bytes_for(capacity, init.max_recv_sge);
    qp->rq_offset_ = segment.allocate(qp->rq_bytes_);
    if (qp->rq_offset_ == 0) {
      delete qp;  // the destructor gives back what was allocated
      return fail(std::errc::not_enough_memory);
    }
    qp->rq_ = segment.at<host::SharedRq>(qp->rq_offset_);
    qp->rq_->capacity = capacity;
    qp->rq_->max_sge = init.max_recv_sge;
    qp->rq_->stride = host::SharedRq::stride_for(init.max_recv_sge);
    qp->rq_->owner_proc = node.proc();
    qp->rq_->pd_id = pd->id();
  }
  auto qpn = node.registry().allocate_qpn(node.proc(), qp->shared_offset_);
  if (!qpn) {
    delete qp;  // the destructor gives back what was allocated
    return fail(qpn.error());
  }
  qp->qpn_ = *qpn;
  qp->sq_head_ = random_start(qp->qpn_);
  qp->sq_tail_.store(qp->sq_head_, std::memory_order_relaxed);
  qp->sq_sent_ = qp->sq_head_;
  qp->sq_retired_.store(qp->sq_head_, std::memory_order_relaxed);
  qp->id_ = node.qps().add(qp);
  host::SharedQp& shared = *qp->shared_;
  shared.qpn = qp->qpn_;
  shared.qp_type = init.type;
  shared.owner_proc = node.proc();
  shared.owner_qp_id = qp->id_;
  shared.pd_id = pd ? pd->id() : 0;
  shared.xrcd_id = init.xrcd ? init.xrcd->id() : 0;
  shared.rq_offset = qp->rq_offset_;
  shared.srq_offset = init.srq ? init.srq->shared_offset() : 0;
  shared.recv_cq_offset = init.recv_cq ? init.recv_cq->shared_offset() : 0;
  shared.state.store(IBV_QPS_RESET, std::memory_order_release);
  // Only now may initiators find it (shm::resolve): its shared state is whole.
  node.registry().publish_qp(qp->qpn_);

  if (pd) pd->attach();
  if (init.xrcd) init.xrcd->attach();
  if (init.send_cq) init.send_cq->attach(qp);
  if (init.recv_cq && init.recv_cq != init.send_cq) init.recv_cq->attach(qp);
  if (init.srq) init.srq->attach();
  qp->attached_ = true;
  return qp;
}

QueuePair::~QueuePair() {
  Node& node = node_;
  // Unpublish first, then wait for initiators working on us to leave: an
  // initiator checks the state only inside its access announcement
  // (shm::still_there), so once the fence has passed every announcement
  // made before the store, no initiator touches this QP's shared state or
  // queues again, and the segment may hand their memory to another object.
  if (tgt_ != nullptr) {
    // One handle fewer; the last one destroys the QP (host::close_tgt_qp).
    leave_tgt();
  } else if (shared_ != nullptr && qpn_ != 0) {
    shared_->state.store(host::SharedQp::kDestroyed, std::memory_order_seq_cst);
    node.registry().release_qpn(qpn_);
    node.forget_multicast(qpn_);
    node.registry().fence_accesses(node.proc());
  }
  // Leave the object table first: remove() waits out a timer run that is
  // progressing us right now, and after it no timer can reach us and park us
  // again; only then leave the waiting list, for good.
  // (id 0: creation failed before the QP got one; 0 must never enter the free list.)
  if (id_ != 0) node.qps().remove(id_);
  // An event the progress thread relayed between ibv_destroy_qp's
  // forget_events and the line above would name freed memory once we are
  // gone (the application polled it and crashed, or hung on a freed
  // mutex): no relay reaches us now, so drop what it left.
  if (void* h = handle.load(std::memory_order_acquire)) context_.forget_events(h);
  node.remove_waiting(this);
  // Only a QP that was created in full holds its PD, CQs and SRQ (a failed
  // create must not drop references it never took: the PD would count one
  // user fewer, or wrap to busy for ever).
  if (attached_) {
    // Receive completions still in the CQ will not find this QP when polled:
    // the SRQ WQEs they hold are given back now.
    const uint32_t unpolled_receives = init_.recv_cq ? init_.recv_cq->detach_counting_receives(this) : 0;
    if (init_.send_cq && init_.recv_cq != init_.send_cq) init_.send_cq->detach(this);
    if (init_.srq) {
      init_.srq->retire(unpolled_receives);
      init_.srq->detach();
    }
    if (pd_) pd_->detach();
    if (init_.xrcd) init_.xrcd->detach();
  }
  host::ProcessSegment& segment = node.segment();
  if (rq_offset_) segment.release(rq_offset_, rq_bytes_);
  if (shared_offset_) segment.release(shared_offset_, sizeof(host::SharedQp));
}

void QueuePair::publish_responder_state() {
  host::SharedQp& s = *shared_;
  s.access.store(attrs_.access_flags, std::memory_order_relaxed);
  s.qkey.store(attrs_.qkey, std::memory_order_relaxed);
  s.dest_qpn.store(attrs_.dest_qpn, std::memory_order_relaxed);
  s.min_rnr_timer.store(attrs_.min_rnr_timer, std::memory_order_relaxed);
  s.max_dest_rd_atomic.store(attrs_.max_dest_rd_atomic, std::memory_order_relaxed);
}

Result<void> QueuePair::check_modify_locked(const ibv_qp_attr& attr, int mask) const {
  QpModifyContext ctx = make_modify_context(init_.type, attrs_);
  const DeviceInfo& device = device_info();
  ctx.gid_table_len = limits::kGidTableLen;
  ctx.populated_gids = 0;
  for (uint32_t i = 0; i < device.gids.size() && i < 64; ++i) ctx.populated_gids |= uint64_t{1} << i;
  auto ok = check_modify_qp(ctx, attr, mask);
  if (!ok)
    SOFTHCA_DEBUG("modify_qp on %sqp 0x%x in state %s rejected (mask 0x%x)", tgt_ ? "tgt " : "", qpn_,
                  qp_state_name(attrs_.state), mask);
  return ok;
}

Result<void> QueuePair::modify(const ibv_qp_attr& attr, int mask) {
  if (tgt_ != nullptr) return modify_tgt(attr, mask);
  std::lock_guard sq_guard(sq_lock_);
  // A peer may have moved us to ERROR since the last modify.
  attrs_.state = state();
  if (auto ok = check_modify_locked(attr, mask); !ok) return ok;
  if (init_.srq != nullptr && init_.srq->tag_list() != nullptr && (mask & IBV_QP_STATE) &&
      attr.qp_state == IBV_QPS_RTR && attrs_.state != IBV_QPS_RTR) {
    // Tag matching runs where the whole message is at hand: the shm link.
    // A peer on another host (the udp link's packets) is refused.
    QpAttributes next = attrs_;
    apply_modify_qp(next, attr, mask, init_.type);
    if (reaches_other_host(next.ah)) {
      SOFTHCA_DEBUG("qp 0x%x: a tag matching srq takes peers on this host only", qpn_);
      return fail(std::errc::operation_not_supported);
    }
  }
  const ibv_qp_state from = attrs_.state;
  apply_modify_qp(attrs_, attr, mask, init_.type);
  const ibv_qp_state to = attrs_.state;
  publish_responder_state();
  if ((mask & IBV_QP_DEST_QPN) != 0) channel_.reset();
  // A connected QP binds to its peer when it reaches RTR (the shm link takes
  // the peer's incarnation then, so a later QP with the same number is not it).
  // (A raw QP has no peer: flow steering picks its frames' receivers.)
  if (to == IBV_QPS_RTR && from != IBV_QPS_RTR && init_.type != IBV_QPT_UD && init_.type != IBV_QPT_RAW_PACKET)
    open_channel_locked();
  // A UD QP receives from anyone: peers on other hosts need this process to listen.
  if (to == IBV_QPS_RTR && from != IBV_QPS_RTR && init_.type == IBV_QPT_UD) node_.udp_link().listen();
  if (to == IBV_QPS_RTS && from == IBV_QPS_RTR && channel_)
    channel_->start_sending(
        link::SendConfig{attrs_.sq_psn, attrs_.retry_cnt, attrs_.rnr_retry, attrs_.timeout, attrs_.max_rd_atomic});
  if (to == IBV_QPS_RESET && from != IBV_QPS_RESET) {
    reset_queues_locked();
    const uint32_t purged_receives = init_.recv_cq ? init_.recv_cq->purge_qp(qpn_) : 0;
    if (init_.send_cq && init_.recv_cq != init_.send_cq) init_.send_cq->purge_qp(qpn_);
    // An SRQ's WQEs that those receive completions held are free again.
    if (init_.srq) init_.srq->retire(purged_receives);
    shared_->comm_established.store(0, std::memory_order_relaxed);
  }
  shared_->state.store(to, std::memory_order_release);
  if (to == IBV_QPS_ERR && from != IBV_QPS_ERR) {
    flush_send_locked();
    flush_recv();
  }
  if (to == IBV_QPS_SQD && sq_sent_ == sq_tail_.load(std::memory_order_relaxed)) {
    mark_sq_drained(attrs_);
    if (attrs_.en_sqd_async_notify) raise_event(IBV_EVENT_SQ_DRAINED);
  }
  if (to == IBV_QPS_RTS) progress_locked(monotonic_ns());
  return {};
}

void QueuePair::query(ibv_qp_attr& attr, ibv_qp_init_attr& init) {
  std::lock_guard guard(sq_lock_);
  if (tgt_ != nullptr) node_.registry().with_tgt_qp(*tgt_, [&](host::TgtQpRecord&) { load_tgt_attributes(); });
  attrs_.state = state();
  std::memset(&attr, 0, sizeof attr);
  query_qp_attributes(attrs_, attr);
  attr.cap.max_send_wr = init_.max_send_wr;
  attr.cap.max_recv_wr = init_.max_recv_wr;
  attr.cap.max_send_sge = init_.max_send_sge;
  attr.cap.max_recv_sge = init_.max_recv_sge;
  attr.cap.max_inline_data = init_.max_inline_data;
  std::memset(&init, 0, sizeof init);
  init.qp_type = init_.type;
  init.sq_sig_all = init_.sq_sig_all ? 1 : 0;
  init.cap = attr.cap;
}

void QueuePair::raise_event(ibv_event_type type) {
  context_.raise_async_event(AsyncEvent{type, handle.load(std::memory_order_acquire), 0});
}

int QueuePair::validate_send_general(const ibv_send_wr& wr) const {
  const uint32_t opcode = send_opcode_of(wr);
  if (opcode == IBV_WR_ATOMIC_WRITE)
    return init_.type == IBV_QPT_RC && (wr.send_flags & kSendFlagAtomicWriteValue) != 0 && wr.num_sge == 0 &&
                   (wr.send_flags & IBV_SEND_INLINE) == 0
               ? 0
               : EINVAL;
  if (opcode >= 32 || ((send_opcodes_ >> opcode) & 1) == 0) return EINVAL;
  if (opcode == IBV_WR_BIND_MW) {
    // The window must be this context's; its MR is checked when the bind executes.
    MemoryWindow* mw = context_.memory_window(wr.bind_mw.mw);
    if (mw == nullptr || &mw->pd().context() != &context_) return EINVAL;
    if (wr.bind_mw.bind_info.length != 0 && context_.memory_region(wr.bind_mw.bind_info.mr) == nullptr) return EINVAL;
    return 0;
  }
  if (opcode == IBV_WR_LOCAL_INV) return 0;
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > init_.max_send_sge) return EINVAL;
  if (wr.num_sge > 0 && wr.sg_list == nullptr) return EINVAL;
  if (wr.send_flags & IBV_SEND_INLINE) {
    if (opcode == IBV_WR_RDMA_READ || opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
        opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
      return EINVAL;
    uint64_t total = 0;
    for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
    if (total > init_.max_inline_data) return EINVAL;
  }
  if (init_.type == IBV_QPT_UD && context_.address_handle(wr.wr.ud.ah) == nullptr) return EINVAL;
  return 0;
}

void QueuePair::enqueue_send_locked(const ibv_send_wr& wr) {
  SendWqe* wqe = sq_slot(sq_head_);
  wqe->wr_id = wr.wr_id;
  wqe->opcode = wr.opcode;
  wqe->send_flags = wr.send_flags;
  wqe->imm_data = wr.imm_data;
  wqe->num_sge = static_cast<uint32_t>(wr.num_sge);
  wqe->length = 0;
  wqe->retry = transport::RetryState::start(attrs_.rnr_retry, attrs_.retry_cnt);
  wqe->ah = nullptr;
  wqe->mw = nullptr;
  if (wr.opcode == IBV_WR_BIND_MW) {
    const ibv_mw_bind_info& info = wr.bind_mw.bind_info;
    MemoryRegion* mr = info.length != 0 ? context_.memory_region(info.mr) : nullptr;
    wqe->mw = context_.memory_window(wr.bind_mw.mw);
    wqe->rkey = wr.bind_mw.rkey;
    wqe->remote_addr = info.addr;
    wqe->compare_add = info.length;
    wqe->bind_lkey = mr != nullptr ? mr->key() : 0;
    wqe->bind_access = static_cast<uint32_t>(info.mw_access_flags);
    wqe->num_sge = 0;
    wqe->inline_len = 0;
    ++sq_head_;
    return;
  }
  if (wr.opcode == IBV_WR_LOCAL_INV) {
    wqe->rkey = wr.invalidate_rkey;
    wqe->num_sge = 0;
    wqe->inline_len = 0;
    ++sq_head_;
    return;
  }
  switch (wr.opcode) {
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:
      wqe->remote_addr = wr.wr.atomic.remote_addr;
      wqe->rkey = wr.wr.atomic.rkey;
      wqe->compare_add = wr.wr.atomic.compare_add;
      wqe->swap = wr.wr.atomic.swap;
      break;
    default:
      wqe->remote_addr = wr.wr.rdma.remote_addr;
      wqe->rkey = wr.wr.rdma.rkey;
      break;
  }
  if (init_.type == IBV_QPT_XRC_SEND) wqe->remote_qpn = wr.qp_type.xrc.remote_srqn;
  if (init_.type == IBV_QPT_UD) {
    wqe->ah = context_.address_handle(wr.wr.ud.ah);
    wqe->remote_qpn = wr.wr.ud.remote_qpn;
    wqe->remote_qkey = wr.wr.ud.remote_qkey;
  }
  if (wr.send_flags & IBV_SEND_INLINE) {
    unsigned char* out = wqe->inline_data(init_.max_send_sge);
    uint32_t len = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      // An empty SGE may carry addr 0: memcpy from nullptr is undefined even for 0 bytes.
      if (wr.sg_list[i].length == 0) continue;
      std::memcpy(out + len, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      len += wr.sg_list[i].length;
    }
    wqe->inline_len = len;
    wqe->num_sge = 0;
  } else {
    wqe->inline_len = 0;
    for (int i = 0; i < wr.num_sge; ++i)
      wqe->sge[i] = Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  }
  ++sq_head_;
}

// What every lane asks of a WR of its shape and of this QP first, as the
// direct path does: a valid WR, the QP in RTS with nothing queued before
// it and room for its WQE.
[[gnu::always_inline]] inline bool QueuePair::lane_takes_locked(const ibv_send_wr& wr) const {
  return validate_send(wr) == 0 && shared_->state.load(std::memory_order_acquire) == IBV_QPS_RTS &&
         sq_sent_ == sq_head_ && sq_tail_.load(std::memory_order_relaxed) == sq_head_ && !parked_ &&
         sq_head_ - sq_retired_.load(std::memory_order_acquire) < init_.max_send_wr;
}

// post_write_direct_locked's conditions, asked in its order, with the
// target's and the key's through the lane; any that does not hold leaves
// the WR to post_send's general loop, untouched.
[[gnu::always_inline]] inline bool QueuePair::post_write_on_lane_locked(const ibv_send_wr& wr) {
  if (wr.opcode != IBV_WR_RDMA_WRITE || wr.num_sge != 1 || !lane_takes_locked(wr)) return false;
  const ibv_sge& sge = wr.sg_list[0];
  const void* local = reinterpret_cast<const void*>(sge.addr);  // inline: validate_send checked its length
  if ((wr.send_flags & IBV_SEND_INLINE) == 0 &&
      (local = direct_local_grant_.find_current(node_.registry(), sge.lkey, 0, sge.addr, sge.length)) == nullptr)
    return false;
  void* landed = memory_lane_.write(local, sge.length, wr.wr.rdma.remote_addr, wr.wr.rdma.rkey);
  if (landed == nullptr) return false;
  complete_direct_write_locked(wr, landed);
  return true;
}

// post_direct_locked's conditions for a READ of one SGE, asked in its
// order, with the target's and the key's through the memory lane; any that
// does not hold leaves the WR to post_send's general loop, untouched.
[[gnu::always_inline]] inline bool QueuePair::post_read_on_lane_locked(const ibv_send_wr& wr) {
  if (wr.opcode != IBV_WR_RDMA_READ || wr.num_sge != 1 || !lane_takes_locked(wr)) return false;
  const ibv_sge& sge = wr.sg_list[0];
  void* local = direct_local_grant_.find_current(node_.registry(), sge.lkey, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length);
  if (local == nullptr || !memory_lane_.read(local, sge.length, wr.wr.rdma.remote_addr, wr.wr.rdma.rkey)) return false;
  complete_direct_locked(wr, sge.length);
  return true;
}

// post_direct_locked's conditions for a SEND of one SGE, asked in its
// order, with the target's, its receive queue's and the receive key's
// through the lane; any that does not hold leaves the WR to post_send's
// general loop, untouched.
[[gnu::always_inline]] inline bool QueuePair::post_on_send_lane_locked(const ibv_send_wr& wr) {
  if ((wr.opcode != IBV_WR_SEND && wr.opcode != IBV_WR_SEND_WITH_IMM) || wr.num_sge != 1 || !lane_takes_locked(wr))
    return false;
  const ibv_sge& sge = wr.sg_list[0];
  const void* local = reinterpret_cast<const void*>(sge.addr);  // inline: validate_send checked its length
  if ((wr.send_flags & IBV_SEND_INLINE) == 0 &&
      (local = direct_local_grant_.find_current(node_.registry(), sge.lkey, 0, sge.addr, sge.length)) == nullptr)
    return false;
  if (!send_lane_.send(local, sge.length, (wr.send_flags & IBV_SEND_SOLICITED) != 0, wr.opcode == IBV_WR_SEND_WITH_IMM,
                       wr.imm_data))
    return false;
  complete_direct_locked(wr, sge.length);
  return true;
}

int QueuePair::post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (!init_.rss_spread.empty()) {  // an RSS QP only receives
    *bad_wr = wr;
    return EINVAL;
  }
  prefetch_for_direct(*wr);
  std::lock_guard guard(sq_lock_);
  // One WRITE, READ or SEND as the last direct one went: its lane
  // (link/shm/memory_lane.hpp, send_lane.hpp).
  if (wr->next == nullptr &&
      ((memory_lane_.armed && (post_write_on_lane_locked(*wr) || post_read_on_lane_locked(*wr))) ||
       (send_lane_.armed && post_on_send_lane_locked(*wr)))) [[likely]] {
    if (sq_sent_ != sq_head_) progress_locked(0);  // as below (the state is RTS)
    return 0;
  }
  const uint32_t st = shared_->state.load(std::memory_order_acquire);
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) {
    SOFTHCA_DEBUG("post_send on qp 0x%x in state %s: move it to RTS first", qpn_,
                  qp_state_name(static_cast<ibv_qp_state>(st)));
    *bad_wr = wr;
    return EINVAL;
  }
  int err = 0;
  for (; wr != nullptr; wr = wr->next) {
    if ((err = validate_send(*wr)) != 0) break;
    // A slot is free once the completion that retires it was polled.
    if (sq_head_ - sq_retired_.load(std::memory_order_acquire) >= init_.max_send_wr) {
      err = ENOMEM;
      break;
    }
    const bool direct = wr->opcode == IBV_WR_RDMA_WRITE && wr->num_sge == 1 ? post_write_direct_locked(*wr)
                                                                          : post_direct_locked(*wr);
    if (!direct) enqueue_send_locked(*wr);
  }
  if (err) *bad_wr = wr;
  // No clock read on the way of every post: progress reads it only where a
  // deadline is involved (a parked WQE, an answer other than ACK). With
  // nothing left to send (the direct path completed it all) it has work
  // only in the error state (the flush).
  if (sq_sent_ != sq_head_ || shared_->state.load(std::memory_order_acquire) == IBV_QPS_ERR) progress_locked(0);
  return err;
}

int QueuePair::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (rq_ == nullptr) {  // an SRQ's, or an XRC QP's (which has no receive queue)
    *bad_wr = wr;
    return EINVAL;
  }
  std::lock_guard guard(rq_lock_);
  const uint32_t st = shared_->state.load(std::memory_order_acquire);
  if (st == IBV_QPS_RESET) {
    *bad_wr = wr;
    return EINVAL;
  }
  int err = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > init_.max_recv_sge ||
        (wr->num_sge > 0 && wr->sg_list == nullptr)) {
      err = EINVAL;
      break;
    }
    const uint64_t retired = rq_retired_.load(std::memory_order_acquire);
    if (rq_->head.load(std::memory_order_relaxed) - retired >= init_.max_recv_wr) {
      err = ENOMEM;
      break;
    }
    static_assert(sizeof(host::RecvSge) == sizeof(ibv_sge));
    // A receive without SGEs (for WRITE_WITH_IMM or zero-byte SENDs) may have
    // sg_list == nullptr; push memcpys from it, so hand it a real (empty) array.
    static constexpr host::RecvSge kNoSge{};
    const auto* sges = wr->num_sge > 0 ? reinterpret_cast<const host::RecvSge*>(wr->sg_list) : &kNoSge;
    if (!rq_->push(wr->wr_id, sges, static_cast<uint32_t>(wr->num_sge), retired)) {
      err = ENOMEM;
      break;
    }
  }
  if (err) *bad_wr = wr;
  if (st == IBV_QPS_ERR) flush_recv();
  return err;
}

CounterSink QueuePair::counters() const {
  return CounterSink(&shared_->counters, &node_.registry().process_counters(node_.proc()));
}

ibv_wc_status QueuePair::complete_send_locked(const SendWqe& wqe, ibv_wc_status status) {
  if (!staging_.empty()) {
    // Another process's memory gets what the WQE brought back only now,
    // and only while its key still stands.
    const auto staged = staging_.find(sq_tail_.load(std::memory_order_relaxed));
    const bool brings_back = wqe.opcode == IBV_WR_RDMA_READ || wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
                             wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (staged != staging_.end() && status == IBV_WC_SUCCESS && brings_back && !staged->second.scatter(node_.host()))
      status = IBV_WC_LOC_PROT_ERR;
  }
  if (status == IBV_WC_SUCCESS && (wqe.opcode == IBV_WR_SEND || wqe.opcode == IBV_WR_SEND_WITH_IMM ||
                                   wqe.opcode == IBV_WR_SEND_WITH_INV))
    counters().add(Counter::kRdmaSends);
  if (status == IBV_WC_RETRY_EXC_ERR) counters().add(Counter::kRetryExceededErr);
  if (status == IBV_WC_RNR_RETRY_EXC_ERR) counters().add(Counter::kRetryRnrExceededErr);
  if (status != IBV_WC_SUCCESS)
    SOFTHCA_INFO("qp 0x%x: send wr 0x%llx (opcode %u) completes with status %d; the qp goes to ERROR", qpn_,
                 static_cast<unsigned long long>(wqe.wr_id), wqe.opcode, static_cast<int>(status));
  finish_send_locked(wqe, status);
  return status;
}

void QueuePair::finish_send_locked(const SendWqe& wqe, ibv_wc_status status) {
  // The tail moves past the WQE before its completion is written: a poller
  // in another thread that sees the completion must find the WQE executed,
  // or retire_send() would take it for a stale one and never free its slot.
  // (The slot itself stays intact until that completion is polled.)
  const uint32_t position = sq_tail_.load(std::memory_order_relaxed);
  if (!staging_.empty()) staging_.erase(position);
  sq_tail_.store(position + 1, std::memory_order_release);
  if (sq_sent_ - position == 0) sq_sent_ = position + 1;  // a synchronous link: sent follows tail
  // In SQD the send queue has drained once every WR it had started is done
  // (the ones not started stay queued).
  if (attrs_.sq_draining && sq_sent_ == position + 1 &&
      shared_->state.load(std::memory_order_relaxed) == IBV_QPS_SQD) {
    mark_sq_drained(attrs_);
    if (attrs_.en_sqd_async_notify) raise_event(IBV_EVENT_SQ_DRAINED);
  }
  if (status == IBV_WC_SUCCESS && !signaled(wqe)) return;
  host::Cqe cqe{};
  cqe.wr_id = wqe.wr_id;
  cqe.status = status;
  cqe.opcode = wc_opcode_for(wqe.opcode);
  cqe.qp_num = qpn_;
  cqe.src_qp = position;
  cqe.flags = host::kCqeSendPosition;
  if (status == IBV_WC_SUCCESS) {
    if (wqe.opcode == IBV_WR_RDMA_READ) cqe.byte_len = static_cast<uint32_t>(wqe.length);
    if (wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
        wqe.opcode == IBV_WR_ATOMIC_WRITE)
      cqe.byte_len = 8;
  }
  init_.send_cq->push(cqe);
}

void QueuePair::progress_locked(uint64_t now_ns) {
  for (;;) {
    const uint32_t st = shared_->state.load(std::memory_order_acquire);
    if (st == IBV_QPS_ERR) {
      flush_send_locked();
      break;
    }
    if (sq_sent_ == sq_head_ || st != IBV_QPS_RTS) break;
    const uint32_t tail = sq_tail_.load(std::memory_order_relaxed);
    SendWqe& wqe = *sq_slot(sq_sent_);
    if (sq_sent_ == tail && wqe.retry.deadline_ns != 0 && now_ns == 0) now_ns = monotonic_ns();
    if (sq_sent_ == tail && wqe.retry.deadline_ns != 0 && now_ns < wqe.retry.deadline_ns) {
      // Parked and not yet due: stay on the node's waiting list. (Breaking out
      // here used to fall into the un-park below, so a poll before the deadline
      // dropped the QP from the list and its RNR/timeout retry never ran.)
      if (!parked_) {
        parked_ = true;
        node_.add_waiting(this);
      }
      return;
    }
    const Step step = execute_locked(wqe, sq_sent_, now_ns);
    if (step.kind == Step::Kind::kInFlight) {
      // Its answer comes from the link's thread (take_answers).
      ++sq_sent_;
      continue;
    }
    if (step.kind == Step::Kind::kNoRoom) break;  // answers will make room and progress again
    const transport::Verdict& verdict = step.verdict;
    if (verdict.kind == transport::Verdict::Kind::kComplete) {
      wqe.retry.deadline_ns = 0;
      const ibv_wc_status status = complete_send_locked(wqe, verdict.status);
      if (status != IBV_WC_SUCCESS) enter_error_locked();
      if (status == IBV_WC_SUCCESS && step.rendezvous_fin) deliver_fin_locked(step.fin_tag, step.fin_app_ctx);
      continue;
    }
    if (!parked_) {
      parked_ = true;
      node_.add_waiting(this);
    }
    return;
  }
  if (parked_) {
    parked_ = false;
    node_.remove_waiting(this);
  }
}

void QueuePair::take_answers() {
  std::lock_guard guard(sq_lock_);
  if (!channel_) return;
  link::Answer answer;
  bool any = false;
  while (channel_ && channel_->next_answer(answer)) {
    any = true;
    const uint32_t tail = sq_tail_.load(std::memory_order_relaxed);
    if (answer.position != tail || tail == sq_sent_) {
      SOFTHCA_WARN("qp 0x%x: an answer for send WQE %u, expected %u; ignored", qpn_, answer.position, tail);
      continue;
    }
    if (complete_send_locked(*sq_slot(tail), answer.status) != IBV_WC_SUCCESS) enter_error_locked();
  }
  if (any) progress_locked(monotonic_ns());
}

void QueuePair::progress(uint64_t now_ns) {
  std::lock_guard guard(sq_lock_);
  progress_locked(now_ns);
}

uint64_t QueuePair::next_deadline() {
  std::lock_guard guard(sq_lock_);
  const uint32_t tail = sq_tail_.load(std::memory_order_relaxed);
  if (tail == sq_head_) return 0;
  return sq_slot(tail)->retry.deadline_ns;
}

void QueuePair::enter_error_locked() {
  if (channel_) channel_->abort();
  uint32_t st = shared_->state.load(std::memory_order_acquire);
  while (st != IBV_QPS_ERR && st != IBV_QPS_RESET)
    if (shared_->state.compare_exchange_weak(st, IBV_QPS_ERR, std::memory_order_acq_rel)) break;
  attrs_.state = IBV_QPS_ERR;
  flush_send_locked();
  flush_recv();
}

void QueuePair::flush_send_locked() {
  if (channel_ && sq_sent_ != sq_tail_.load(std::memory_order_relaxed)) channel_->abort();
  while (sq_tail_.load(std::memory_order_relaxed) != sq_head_)
    finish_send_locked(*sq_slot(sq_tail_.load(std::memory_order_relaxed)), IBV_WC_WR_FLUSH_ERR);
  sq_sent_ = sq_head_;
}

void QueuePair::flush_recv() {
  if (rq_ == nullptr) return;  // an SRQ's WQEs belong to the SRQ, not to this QP
  alignas(16) unsigned char storage[sizeof(host::RecvWqe) + limits::kMaxSge * sizeof(host::RecvSge)];
  auto* wqe = reinterpret_cast<host::RecvWqe*>(storage);
  while (rq_->take(wqe, nullptr)) {
    host::Cqe cqe{};
    cqe.wr_id = wqe->wr_id;
    cqe.status = IBV_WC_WR_FLUSH_ERR;
    cqe.opcode = IBV_WC_RECV;
    cqe.qp_num = qpn_;
    init_.recv_cq->push(cqe);
  }
}

void QueuePair::reset_queues_locked() {
  // The CQs are purged of this QP's completions, so nothing will retire the
  // slots they held: every slot is free again. The retired counts change
  // under the CQs' poll locks, where polls retire (retire_send/retire_recv).
  sq_tail_.store(sq_head_, std::memory_order_release);
  sq_sent_ = sq_head_;
  const auto free_send_slots = [this] { sq_retired_.store(sq_head_, std::memory_order_release); };
  if (init_.send_cq != nullptr) {
    init_.send_cq->run_locked(free_send_slots);
  } else {
    free_send_slots();
  }
  staging_.clear();
  if (rq_ != nullptr) {
    std::lock_guard guard(rq_lock_);
    const uint64_t head = rq_->head.load(std::memory_order_acquire);
    rq_->tail.store(head, std::memory_order_release);
    const auto free_receive_slots = [this, head] { rq_retired_.store(head, std::memory_order_release); };
    if (init_.recv_cq != nullptr) {
      init_.recv_cq->run_locked(free_receive_slots);
    } else {
      free_receive_slots();
    }
  }
  channel_.reset();
}

// Under the send CQ's poll lock, as every other write of sq_retired_ after
// creation (reset_queues_locked): a load and a store, no locked instruction.
void QueuePair::retire_send(uint32_t position) {
  const uint32_t next = position + 1;
  const uint32_t retired = sq_retired_.load(std::memory_order_relaxed);
  // Only a WQE that executed, and that is not retired yet, can retire slots.
  const uint32_t tail = sq_tail_.load(std::memory_order_acquire);
  if (next - retired == 0 || next - retired > tail - retired) return;
  sq_retired_.store(next, std::memory_order_release);
}

// Under the receive CQ's poll lock, as every other write of rq_retired_ and
// rq_taken_floor_ (reset_queues_locked): plain stores. (An SRQ feeds
// several CQs, so its count is retired with a CAS.)
void QueuePair::retire_recv(const uint32_t* taken_at) {
  if (init_.srq != nullptr) {
    init_.srq->retire();
    return;
  }
  if (rq_ == nullptr) return;
  const uint64_t retired = rq_retired_.load(std::memory_order_relaxed);
  // A count of WQEs known taken (never past rq_->tail), read before the
  // tail's line, which takers write at every message.
  uint64_t taken = rq_taken_floor_.load(std::memory_order_relaxed);
  if (taken_at != nullptr) {
    // The taker moved the tail past the WQE before it completed it, so the
    // tail is beyond its position. A position behind what is retired (a
    // completion from before a reset) says nothing.
    const auto ahead = static_cast<int32_t>(*taken_at - static_cast<uint32_t>(retired));
    if (ahead >= 0) taken = std::max(taken, retired + static_cast<uint64_t>(ahead) + 1);
  }
  if (taken <= retired) taken = std::max(taken, rq_->tail.load(std::memory_order_acquire));
  rq_taken_floor_.store(taken, std::memory_order_relaxed);
  // A completion that names no taken WQE (a stale one) frees nothing.
  if (taken > retired) rq_retired_.store(retired + 1, std::memory_order_release);
}

void QueuePair::on_remote_event(uint32_t detail) {
  const auto event = static_cast<ibv_event_type>(detail);
  if (event == IBV_EVENT_QP_FATAL || event == IBV_EVENT_QP_ACCESS_ERR || event == IBV_EVENT_QP_REQ_ERR) {
    // The initiator already moved us to ERROR; flush what is queued. If the
    // application reset the QP before this event arrived, the error is over:
    // forcing ERROR again would break the QP it just restated.
    std::lock_guard guard(sq_lock_);
    if (state() == IBV_QPS_ERR) {
      attrs_.state = IBV_QPS_ERR;
      flush_send_locked();
      flush_recv();
    }
  }
  raise_event(event);
}

Result<void> QueuePair::attach_multicast(const uint8_t* mgid) {
  // ibv_attach_mcast names no address: the group is joined on every interface that can reach other hosts.
  return node_.attach_multicast(qpn_, mgid, group_interfaces(device_info().gids, mgid));
}

Result<void> QueuePair::detach_multicast(const uint8_t* mgid) { return node_.detach_multicast(qpn_, mgid); }

bool QueuePair::reaches_other_host(const QpAddressVector& ah) {
  const bool force_udp = setting_number(SettingId::kLink) == 1;
  return ah.is_global && (force_udp || !is_local_gid(std::span<const uint8_t, 16>(ah.dgid.data(), 16)));
}

void QueuePair::open_channel_locked() {
  const QpAddressVector& ah = attrs_.ah;
  link::ChannelConfig config;
  config.local_qpn = qpn_;
  config.qp_type = init_.type;
  config.dest_qpn = attrs_.dest_qpn;
  std::memcpy(config.dgid, ah.dgid.data(), 16);
  if (const GidEntry* sgid = device_info().gid_at(ah.sgid_index)) {
    std::memcpy(config.sgid, sgid->raw.data(), 16);
    // fe80::/10 means something only on one link: say which.
    if (sgid->raw[0] == 0xFE && (sgid->raw[1] & 0xC0) == 0x80) config.ifindex = sgid->ifindex;
  }
  config.traffic_class = ah.traffic_class;
  config.hop_limit = ah.hop_limit;
  config.flow_label = ah.flow_label;
  // Packets never exceed what the interfaces carry (the port's active MTU),
  // whatever path MTU the application set: both ends segment alike.
  config.mtu = std::min(128u << attrs_.path_mtu, device_info().active_mtu_bytes);
  config.rq_psn = attrs_.rq_psn;
  config.max_dest_rd_atomic = attrs_.max_dest_rd_atomic;
  config.qp_counters = &shared_->counters;
  config.memory_lane = &memory_lane_;
  config.send_lane = &send_lane_;
  Node* node = &node_;
  const uint32_t id = id_;
  config.on_answers = [node, id] { node->qps().with(id, [](QueuePair& qp) { qp.take_answers(); }); };
  // Without a GRH there is no address to route by: the peer is on this host.
  // With one, a GID of this host is reached through shared memory unless
  // SOFTHCA_LINK=udp asks for packets; any other GID over the udp link.
  const bool remote = reaches_other_host(ah);
  // An XRC TGT QP sends nothing: on this host the initiator reaches it
  // directly and it needs no channel; from another host it receives
  // through the udp link's channel (its responder flow).
  if (!remote && init_.type == IBV_QPT_XRC_RECV) {
    channel_.reset();
    return;
  }
  channel_ = remote ? node_.udp_link().open_channel(config) : node_.shm_link().open_channel(config);
  if (remote && !channel_)
    SOFTHCA_WARN("qp 0x%x: no udp link (UDP port 4791 cannot be bound): its peer cannot be reached", qpn_);
}

}  // namespace softhca::engine
