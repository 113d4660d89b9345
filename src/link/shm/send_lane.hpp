// A connected QP's SEND to its peer on this host, as the last direct SEND
// found the way: the target QP it reached, the receive queue it took a WQE
// from (the QP's own or its SRQ's), and the grant of the receive WQE's
// key, kept by the QP and used from the top of ibv_post_send -- the WRITE
// lane's counterpart (memory_lane.hpp).
//
// A SEND latency test's time is, on each side, the instructions between the
// peer's completion arriving and this side's completion landing at the
// peer (docs/performance.md). The direct SEND (ShmChannel::send_direct)
// gets there through the QP's general direct post, a DirectCopy, the
// channel's virtual call and a scatter loop over up to kMaxSge SGEs; the
// lane asks the same questions for the common shape only: a SEND (with or
// without immediate data) of one range, into a receive WQE whose first SGE
// takes it whole, under the key the last direct SEND's receive SGE used.
// Under the
// access announcement to the target's process, as there, each is judged
// again at every SEND: the target still the same incarnation and receiving
// (shm::target_receives), the WQE at the queue's tail posted (its mark),
// the receive key's registry slot at the version of the grant. Whatever
// does not hold makes the lane answer false with nothing done, and the
// SEND goes the general way, which gives every outcome (RNR, a length
// error, an SRQ armed with a limit, another key, a scatter over several
// SGEs).
//
// Armed by the shm channel (ShmChannel::send_direct) after a direct SEND
// succeeded (into a QP's own queue, or an SRQ without tag matching),
// disarmed when the
// channel resolves its target again or is destroyed; written and read under
// the QP's send lock only.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "common/counters.hpp"
#include "host/attachment.hpp"
#include "host/host_registry.hpp"
#include "host/shared_queues.hpp"
#include "link/key_grant.hpp"
#include "link/shm/copy_write.hpp"
#include "link/shm/shm_port.hpp"
#include "link/shm/target.hpp"
#include "transport/responder.hpp"

namespace softhca::shm {

struct SendLane {
  bool armed = false;
  uint32_t qp_type = 0;  // the requester's
  uint32_t src_qpn = 0;  // the requester's QPN, which the receive completion names
  uint32_t self = 0;     // this process's registry slot
  host::Attachment* host = nullptr;
  TargetQp target;
  // The target QP's receive queue: its own, or its SRQ's (`srq`; not a tag
  // matching one). Neither moves while the QP is the incarnation `target`
  // names, and an SRQ outlives the QPs that use it.
  host::SharedRq* rq = nullptr;
  bool srq = false;
  host::SharedCq* cq = nullptr;  // ... and the CQ of that queue (which the QP holds while it lives)
  link::KeyGrant grant;  // the last receive SGE's key, LOCAL_WRITE, in the receive queue's PD
  uint64_t longest = 0;  // the longest SEND the channel makes in one piece

  // The SEND of `length` bytes from `local` (this process's, checked),
  // done: copied into the receive WQE at the target's tail and its
  // completion pushed. False when anything differs from what the lane was
  // armed with (nothing happened). Always inlined: it is the SEND's
  // critical path.
  [[gnu::always_inline]] bool send(const void* local, uint64_t length, bool solicited, bool with_imm,
                                   uint32_t imm_data) const {
    if (length == 0 || length > longest) return false;
    host::HostRegistry& registry = host->registry();
    // The thread's own announcement slot, as the memory lane's.
    const uint32_t slot = registry.try_begin_owned_access(self, target.proc);
    if (slot == host::HostRegistry::kNoAccessSlot) return false;
    const bool done = take_and_complete(registry, local, length, solicited, with_imm, imm_data);
    registry.end_access(self, slot);
    return done;
  }

 private:
  [[gnu::always_inline]] bool take_and_complete(host::HostRegistry& registry, const void* local,
                                                uint64_t length, bool solicited, bool with_imm,
                                                uint32_t imm_data) const {
    if (!target_receives(target, qp_type)) return false;
    // An SRQ armed with a limit: the general way raises its event.
    if (srq && rq->limit.load(std::memory_order_acquire) != 0) return false;
    uint64_t tail = rq->tail.load(std::memory_order_acquire);
    const host::RecvWqe* wqe = rq->posted_at(tail);
    if (wqe == nullptr) return false;  // none posted (RNR), or its mark not stored yet
    const uint64_t wr_id = wqe->wr_id;
    const uint32_t num_sge = wqe->num_sge;
    // Read once, into a local: what is checked is what is used.
    const host::RecvSge sge = wqe->sge[0];
    // The general scatter takes the SGEs in order, skipping empty ones: a
    // first SGE that holds the whole message is all it uses.
    if (num_sge == 0 || rq->max_sge == 0 || sge.length < length) return false;
    char* at = grant.find_current(registry, sge.lkey, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length);
    if (at == nullptr) return false;
    if (!rq->tail.compare_exchange_strong(tail, tail + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      return false;
    copy_write(at, local, length);
    // ShmResponderPort::complete_direct_receive, inline: the CQ entry
    // (from its own queue the owner frees the slot without reading the
    // tail), the push,
    // the counters and, rarely, an event for the owner. The counters come
    // after the push: two locked instructions less before the store the
    // peer waits for, and statistics need no order with the completion.
    transport::ReceivedMessage message;
    message.op = with_imm ? transport::Operation::kSendWithImm : transport::Operation::kSend;
    message.src_qpn = src_qpn;
    message.solicited = solicited;
    message.imm_data = imm_data;
    const host::Cqe cqe = ShmResponderPort::receive_cqe(
        target, transport::receive_completion(wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, length, message),
        srq ? nullptr : &tail);
    const host::SharedCq::Push pushed = cq->push_announced(target.base, cqe);
    target.qp->counters.add(Counter::kRdmaRecvs);
    registry.process_counters(target.proc).add(Counter::kRdmaRecvs);
    if (pushed != host::SharedCq::Push::kOk) [[unlikely]]
      ShmResponderPort::notify_receive_cq(*host, target, *cq, pushed);
    return true;
  }
};

}  // namespace softhca::shm
