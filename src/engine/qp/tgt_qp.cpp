// XRC TGT (XRC_RECV) QPs: the host's, not a process's. ibv_create_qp_ex
// makes one with its creator as the first handle; ibv_open_qp gives any
// process with the same XRC domain another handle. Every handle modifies
// and queries the same attributes (host::TgtQpRecord, under the registry
// mutex) and gets the QP's events; the QP lives while any handle does, as
// the kernel keeps an XRC target QP while any process has it open.
//
// Over the udp link, one handle serves the QP's peer on another host: the
// one that last moved the QP to RTR with that peer's address opens the
// QP's channel there, and the others drop theirs (kTgtSync). When the
// serving handle goes, the registry picks another, which opens a channel
// where the last one stopped (SharedQp::resume_psn).
#include <cstring>
#include <type_traits>

#include "common/log.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/xrc_domain.hpp"
#include "host/attachment.hpp"
#include "host/host_registry.hpp"

namespace softhca::engine {

static_assert(std::is_trivially_copyable_v<QpAttributes> && sizeof(QpAttributes) <= host::kTgtAttributeBytes,
              "a TGT QP's attributes are kept as bytes in the host registry");

namespace {

bool receiving(uint32_t state) { return state == IBV_QPS_RTR || state == IBV_QPS_RTS || state == IBV_QPS_SQD; }
// A connection ends at RESET (and INIT after it); in ERROR the channel stays
// to answer the peer, as a process's own QP's does.
bool connected(uint32_t state) { return state != IBV_QPS_RESET && state != IBV_QPS_INIT; }

void tell(Node& node, const host::TgtHandle& handle) {
  node.host().notify(handle.proc, handle.pid,
                     host::Event{static_cast<uint32_t>(host::EventKind::kTgtSync), handle.qp_id, 0, 0});
}

}  // namespace

void QueuePair::load_tgt_attributes() {
  std::memcpy(static_cast<void*>(&attrs_), tgt_->attributes, sizeof attrs_);
  attrs_.state = state();
}

void QueuePair::store_tgt_attributes() { std::memcpy(tgt_->attributes, static_cast<const void*>(&attrs_), sizeof attrs_); }

bool QueuePair::serves_tgt() const {
  const uint32_t server = tgt_->server_plus1.load(std::memory_order_relaxed);
  if (server == 0 || server > host::kMaxTgtHolders) return false;
  const host::TgtHolder& h = tgt_->holders[server - 1];
  return h.proc_plus1.load(std::memory_order_relaxed) == node_.proc() + 1 &&
         h.qp_id.load(std::memory_order_relaxed) == id_;
}

Result<void> QueuePair::create_tgt(Node& node) {
  id_ = node.qps().add(this);
  auto made = node.registry().create_tgt_qp(node.proc(), node.pid(), id_);
  if (!made) return fail(made.error());
  tgt_ = made->record;
  qpn_ = made->qpn;
  shared_ = &tgt_->shared;
  host::SharedQp& shared = *shared_;
  shared.qpn = qpn_;
  shared.qp_type = IBV_QPT_XRC_RECV;
  shared.owner_proc = host::kHostOwned;
  shared.xrcd_id = init_.xrcd->id();
  // Nobody can open it before it is published: no lock needed yet.
  store_tgt_attributes();
  shared.state.store(IBV_QPS_RESET, std::memory_order_release);
  node.registry().publish_qp(qpn_);
  return {};
}

Result<QueuePair*> QueuePair::open(Context& context, XrcDomain& xrcd, uint32_t qpn) {
  QpInitAttr init{};
  init.type = IBV_QPT_XRC_RECV;
  init.xrcd = &xrcd;
  auto* qp = new QueuePair(nullptr, context, init);
  qp->sq_capacity_ = 1;  // sends nothing, as the QP it opens
  qp->sq_stride_ = SendWqe::stride_for(0, 0);
  qp->sq_.assign(qp->sq_stride_, 0);
  Node& node = context.node();
  qp->id_ = node.qps().add(qp);
  auto record = node.registry().open_tgt_qp(qpn, xrcd.id(), node.proc(), node.pid(), qp->id_);
  if (!record) {
    SOFTHCA_DEBUG("open_qp 0x%x: no TGT QP of this XRC domain has that number", qpn);
    delete qp;
    return fail(record.error());
  }
  qp->tgt_ = *record;
  qp->qpn_ = qpn;
  qp->shared_ = &(*record)->shared;
  xrcd.attach();
  qp->attached_ = true;
  return qp;
}

void QueuePair::leave_tgt() {
  host::TgtHandle next{};
  bool last = false;
  {
    // Stop serving first: a successor resumes at the PSN this channel
    // reached. Under the send lock, so that a kTgtSync the progress thread
    // is handling cannot open the channel again in between.
    std::lock_guard guard(sq_lock_);
    channel_.reset();
    last = node_.registry().close_tgt_qp(qpn_, node_.proc(), id_, &next);
  }
  if (!last && next.pid != 0) tell(node_, next);
}

Result<void> QueuePair::modify_tgt(const ibv_qp_attr& attr, int mask) {
  std::lock_guard sq_guard(sq_lock_);
  host::HostRegistry& registry = node_.registry();
  std::optional<host::TgtHandle> previous_server;
  bool serve = false;
  auto changed = registry.with_tgt_qp(*tgt_, [&](host::TgtQpRecord&) -> Result<void> {
    load_tgt_attributes();
    if (auto ok = check_modify_locked(attr, mask); !ok) return ok;
    const ibv_qp_state from = attrs_.state;
    apply_modify_qp(attrs_, attr, mask, init_.type);
    const ibv_qp_state to = attrs_.state;
    store_tgt_attributes();
    publish_responder_state();
    if (to == IBV_QPS_RTR && from != IBV_QPS_RTR) {
      // A new connection: its PSNs start at rq_psn, whoever served before.
      shared_->resume_psn.store(0, std::memory_order_relaxed);
      if (reaches_other_host(attrs_.ah)) {
        previous_server = registry.serve_tgt_locked(*tgt_, node_.proc(), id_);
        serve = true;
      }
    }
    if (to == IBV_QPS_RESET && from != IBV_QPS_RESET) {
      shared_->comm_established.store(0, std::memory_order_relaxed);
      shared_->resume_psn.store(0, std::memory_order_relaxed);
    }
    shared_->state.store(to, std::memory_order_release);
    if (!serve && !serves_tgt()) {
      // The serving handle, elsewhere, follows the state (a reset drops its channel).
      if (auto server = registry.tgt_server(qpn_)) previous_server = server;
    }
    return {};
  });
  if (!changed) return changed;
  if (serve) {
    open_channel_locked();
  } else if ((mask & IBV_QP_DEST_QPN) != 0 || !connected(state())) {
    channel_.reset();
  }
  if (previous_server) tell(node_, *previous_server);
  return {};
}

void QueuePair::sync_tgt_channel() {
  if (tgt_ == nullptr) return;  // a stale event for an id reused since
  std::lock_guard guard(sq_lock_);
  bool serve = false;
  node_.registry().with_tgt_qp(*tgt_, [&](host::TgtQpRecord&) {
    load_tgt_attributes();
    serve = serves_tgt() && connected(attrs_.state) && reaches_other_host(attrs_.ah);
  });
  if (!serve) {
    channel_.reset();
    return;
  }
  if (channel_ || !receiving(attrs_.state)) return;
  // Taking over from another handle: on from where its responder was.
  const uint32_t resume = shared_->resume_psn.load(std::memory_order_acquire);
  if (resume & host::SharedQp::kResumeValid) attrs_.rq_psn = resume & kPsnMask;
  SOFTHCA_DEBUG("tgt qp 0x%x: this handle now serves its remote peer, from psn 0x%x", qpn_, attrs_.rq_psn);
  open_channel_locked();
}

}  // namespace softhca::engine
