// The shm link: the initiator executes the responder itself, on the target
// QP's shared state, for peers on this host.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common/log.hpp"
#include "host/attachment.hpp"
#include "host/raw_flows.hpp"
#include "link/link.hpp"
#include "link/key_grant.hpp"
#include "link/registered_key.hpp"
#include "link/shm/copy_write.hpp"
#include "link/shm/send_lane.hpp"
#include "link/shm/shm_port.hpp"
#include "link/shm/target.hpp"
#include "link/shm/memory_lane.hpp"
#include "transport/answer_counters.hpp"
#include "transport/memory_key.hpp"
#include "wire/ud_grh.hpp"

namespace softhca::shm {
namespace {

class ShmChannel final : public link::Channel {
 public:
  ShmChannel(host::Attachment& host, uint32_t qp_type, uint32_t dest_qpn, MemoryLane* memory_lane,
             SendLane* send_lane)
      : host_(host),
        qp_type_(qp_type),
        reliable_(qp_type == IBV_QPT_RC || qp_type == IBV_QPT_XRC_SEND),
        dest_qpn_(dest_qpn),
        lane_(memory_lane),
        send_lane_(send_lane) {
    disarm_lanes();
    // Bind to the peer that has the QPN now; if there is none yet, to the
    // one found at the first send.
    if (resolve(host_, dest_qpn_, target_)) {
      peer_incarnation_ = target_.incarnation;
    } else {
      target_ = TargetQp{};
    }
  }

  ~ShmChannel() override { disarm_lanes(); }

  transport::Response deliver(const transport::Request& request, uint32_t) override {
    // The general path may find the target again: the lanes stand for
    // the one the last direct WRITE or SEND reached.
    disarm_lanes();
    // The QP we hold may have been destroyed since (its QPN then names
    // another QP, or none): resolve again, once.
    for (bool again = true;; again = false) {
      if (target_.qp == nullptr && !resolve(host_, dest_qpn_, target_)) {
        target_ = TargetQp{};
        return transport::Response{transport::Syndrome::silence(), 0};
      }
      MemoryAccess access(host_, target_.proc);
      if (!still_there(target_)) {
        target_ = TargetQp{};
        if (again) continue;
        return transport::Response{transport::Syndrome::silence(), 0};
      }
      // A QP that took over the QPN of the one we were connected to is not
      // our peer: like a responder that drops packets of a PSN it does not
      // expect, it answers nothing, and an RC requester ends in RETRY_EXC_ERR.
      if (peer_incarnation_ == 0) {
        peer_incarnation_ = target_.incarnation;
      } else if (target_.incarnation != peer_incarnation_) {
        return transport::Response{transport::Syndrome::silence(), 0};
      }
      ShmResponderPort port(host_, target_);
      const transport::Response response = transport::respond(request, port, reliable_, scratch_);
      transport::count_sent_answer(
          CounterSink(&target_.qp->counters, &host_.registry().process_counters(counted_proc(target_, host_.proc()))),
          response.syndrome.answer);
      return response;
    }
  }

  bool copy_direct(link::DirectCopy& op) override;
  void* write_direct(const void* local, uint64_t length, uint64_t remote_addr, uint32_t rkey) override;
  bool send_direct(const link::DirectCopy& op) override;

 private:
  [[gnu::always_inline]] bool direct_reaches(uint64_t length) const;
  void disarm_lanes() {
    if (lane_ != nullptr) lane_->armed = false;
    if (send_lane_ != nullptr) send_lane_->armed = false;
  }
  // After a direct WRITE or READ under remote_grant_: the memory lane, for
  // the next ones.
  void arm_lane();
  // After a direct SEND into receive queue `rq` (the target QP's own, or
  // its SRQ's), under receive_grant_: the SEND lane, for the next ones of
  // QP `src_qpn`.
  void arm_send_lane(host::SharedRq* rq, bool srq, uint32_t src_qpn);
  [[gnu::always_inline]] bool direct_target_receives() const;
  char* remote_range(uint32_t rkey, uint64_t remote_addr, uint64_t length, uint32_t needed);
  char* receive_range(const host::RecvSge& sge, uint64_t take, uint32_t receive_pd, host::PeerBackings::View& window);

 private:
  host::Attachment& host_;
  const uint32_t qp_type_;  // the requester's
  const bool reliable_;
  const uint32_t dest_qpn_;
  MemoryLane* const lane_;  // the QP's (ChannelConfig::memory_lane), or nullptr
  SendLane* const send_lane_;  // the QP's (ChannelConfig::send_lane), or nullptr
  TargetQp target_;
  uint64_t peer_incarnation_ = 0;
  transport::MessageInProgress scratch_;  // the responder's, for each message (under the QP's send lock)
  // The direct paths' last rkey and receive lkey (under the QP's send lock),
  // and what they granted (link/key_grant.hpp). The receive grant is worked
  // out for the target's receive PD, which stays while the target does
  // (peer_incarnation_).
  host::MrLookupCache remote_key_;
  host::MrLookupCache receive_key_;
  link::KeyGrant remote_grant_;
  link::KeyGrant receive_grant_;
};

// Both direct paths first need a peer reached before and still the same
// incarnation (deliver() resolves and checks it), and a length the general
// path would copy in one piece.
inline bool ShmChannel::direct_reaches(uint64_t length) const {
  return target_.qp != nullptr && target_.base != nullptr && peer_incarnation_ != 0 &&
         target_.incarnation == peer_incarnation_ && length != 0 && length <= kFenceChunk;
}

// Then, under the access announcement, a target that receives
// (shm::target_receives).
inline bool ShmChannel::direct_target_receives() const { return target_receives(target_, qp_type_); }

// remote_range's checks as the direct path asks them (under the access
// announcement): the key, of the QP's process (another's goes through the
// port's second target), neither on-demand (checked page by page) nor beyond
// what the key grants, and the range in the owner's file
// (ShmResponderPort::local_views). Where they hold, the key's grant is
// worked out for the operations after this one.
char* ShmChannel::remote_range(uint32_t rkey, uint64_t remote_addr, uint64_t length, uint32_t needed) {
  remote_grant_ = link::KeyGrant{};
  if (!host_.registry().lookup_mr_cached(rkey, remote_key_) || remote_key_.record.proc != target_.proc)
    return nullptr;
  const host::MrRecord& mr = remote_key_.record;
  const transport::MemoryKey key = link::registered_key(mr);
  const uint32_t pd_id = target_.qp->pd_id;
  if (transport::is_on_demand(key) ||
      !transport::remote_key_allows(key, pd_id, target_.qpn, needed, remote_addr, length))
    return nullptr;
  const auto owner_addr = reinterpret_cast<uint64_t>(transport::owner_address(key, remote_addr));
  host::PeerBackings::View window{target_.backing, target_.backing_length};
  char* at = host_.in_backing(target_.proc, mr.shared, owner_addr, length, window);
  if (at == nullptr) return nullptr;
  target_.backing = window.base;
  target_.backing_length = window.length;
  remote_grant_ = link::remote_grant(key, mr.shared, remote_key_.seq, pd_id, target_.qpn, window);
  return at;
}

// A receive SGE as scatter_next checks it, for a direct SEND (under the
// access announcement): the key, of the target's process, neither on-demand
// nor short of local write over the whole SGE in the receive queue's PD,
// and the `take` bytes written in the owner's file. Where they hold, the
// key's grant is worked out for the SENDs after this one.
char* ShmChannel::receive_range(const host::RecvSge& sge, uint64_t take, uint32_t receive_pd,
                                host::PeerBackings::View& window) {
  receive_grant_ = link::KeyGrant{};
  if (!host_.registry().lookup_mr_cached(sge.lkey, receive_key_) || receive_key_.record.proc != target_.proc)
    return nullptr;
  const host::MrRecord& mr = receive_key_.record;
  const transport::MemoryKey key = link::registered_key(mr);
  if (transport::is_on_demand(key) ||
      !transport::local_key_allows(key, receive_pd, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length))
    return nullptr;
  const auto owner_addr = reinterpret_cast<uint64_t>(transport::owner_address(key, sge.addr));
  char* at = host_.in_backing(target_.proc, mr.shared, owner_addr, take, window);
  if (at == nullptr) return nullptr;
  receive_grant_ = link::receive_grant(key, mr.shared, receive_key_.seq, receive_pd, window);
  return at;
}

// What deliver() would do for an RC WRITE, READ or atomic that succeeds,
// and only that: every condition the responder checks is asked here as a
// predicate, the first one that does not hold hands the message back (false)
// before anything is touched, and deliver() then gives the outcome (an error
// NAK and its event, COMM_EST, a copy through process_vm, a chunked copy).
// So the rules stay where they are; this is their conjunction for the common
// case, without the general responder's records, scratch and indirect calls.
bool ShmChannel::copy_direct(link::DirectCopy& op) {
  using Kind = link::DirectCopy::Kind;
  if (op.kind == Kind::kSend || op.kind == Kind::kSendWithImm) return false;  // send_direct's
  if (op.kind == Kind::kWrite) {
    op.landed = write_direct(op.local, op.length, op.remote_addr, op.rkey);
    return op.landed != nullptr;
  }
  const bool atomic = op.kind == Kind::kFetchAdd || op.kind == Kind::kCompareSwap;
  // RC (UC has nothing but WRITEs a responder answers); a peer reached
  // before, the same incarnation, another process's QP (a TGT QP is the
  // host's and never RC or UC).
  if (qp_type_ != IBV_QPT_RC || !direct_reaches(op.length) ||
      (atomic && (op.length != 8 || (op.remote_addr & 7) != 0)))
    return false;
  MemoryAccess access(host_, target_.proc);
  if (!direct_target_receives()) return false;
  const host::SharedQp& qp = *target_.qp;
  const uint32_t needed = op.kind == Kind::kRead ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_ATOMIC;
  // transport::accept / respond: the QP's access flags, the responder
  // resources of a READ or an atomic.
  if ((qp.access.load(std::memory_order_acquire) & needed) != needed ||
      qp.max_dest_rd_atomic.load(std::memory_order_relaxed) == 0)
    return false;
  // The key as the last operation found it, while its slot has not changed.
  char* at = remote_grant_.find_current(host_.registry(), op.rkey, needed, op.remote_addr, op.length);
  if (at == nullptr && (at = remote_range(op.rkey, op.remote_addr, op.length, needed)) == nullptr) return false;
  op.landed = at;
  switch (op.kind) {
    case Kind::kWrite:
      return false;  // write_direct's (above)
    case Kind::kRead:
      std::memcpy(op.local, at, op.length);
      arm_lane();
      break;
    case Kind::kFetchAdd:
    case Kind::kCompareSwap: {
      // As ShmResponderPort::atomic: one CPU atomic on the shared word, under
      // the host's stripe for the owner's address (IBV_ATOMIC_HCA).
      host::AtomicStripe& stripe = host_.registry().atomic_stripe(target_.pid, remote_grant_.owner_address(op.remote_addr));
      while (stripe.locked.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
      auto* word = reinterpret_cast<uint64_t*>(at);
      uint64_t original = op.compare_add;
      if (op.kind == Kind::kFetchAdd) {
        original = __atomic_fetch_add(word, op.compare_add, __ATOMIC_SEQ_CST);
      } else {
        __atomic_compare_exchange_n(word, &original, op.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      }
      stripe.locked.store(0, std::memory_order_release);
      std::memcpy(op.local, &original, sizeof original);
      break;
    }
    case Kind::kSend:
    case Kind::kSendWithImm:
      return false;  // send_direct's
  }
  return true;  // an ACK: no counter (transport::count_sent_answer)
}

// copy_direct's WRITE: RC or UC, the same checks as for a READ or atomic
// but for the access asked, and no responder resources (a WRITE uses none).
void* ShmChannel::write_direct(const void* local, uint64_t length, uint64_t remote_addr, uint32_t rkey) {
  if ((qp_type_ != IBV_QPT_RC && qp_type_ != IBV_QPT_UC) || !direct_reaches(length)) return nullptr;
  MemoryAccess access(host_, target_.proc);
  if (!target_takes_writes(target_, qp_type_)) return nullptr;
  // The key as the last operation found it, while its slot has not changed.
  char* at = remote_grant_.find_current(host_.registry(), rkey, IBV_ACCESS_REMOTE_WRITE, remote_addr, length);
  if (at == nullptr && (at = remote_range(rkey, remote_addr, length, IBV_ACCESS_REMOTE_WRITE)) == nullptr)
    return nullptr;
  copy_write(at, local, length);
  arm_lane();
  return at;
}

// The memory lane asks what write_direct and copy_direct's READ asked, of
// copies of what they read: the target (direct_reaches held: a peer reached
// before, this incarnation, not a TGT QP) and the key's grant, which the
// operation just used.
void ShmChannel::arm_lane() {
  if (lane_ == nullptr || (qp_type_ != IBV_QPT_RC && qp_type_ != IBV_QPT_UC)) return;
  lane_->qp_type = qp_type_;
  lane_->self = host_.proc();
  lane_->registry = &host_.registry();
  lane_->target = target_;
  lane_->grant = remote_grant_;
  lane_->longest = kFenceChunk;
  lane_->armed = remote_grant_.key != 0;  // each operation asks the grant for its own access
}

// A SEND as deliver() would run it when it succeeds: the receive WQE at the
// queue's tail is read without being taken, its SGEs checked as
// scatter_next checks them, and only then taken (tail moved from where it
// was read); whoever took it first (the owner flushing the queue, another
// sender) sends this one the general way. Once taken, nothing can fail: the
// payload is copied and the completion written by the port's own
// complete_receive. An SRQ armed with a limit (its event), a tag matching
// SRQ and a queue without a WQE (RNR; for UC, a dropped message) go the
// general way.
bool ShmChannel::send_direct(const link::DirectCopy& op) {
  if ((qp_type_ != IBV_QPT_RC && qp_type_ != IBV_QPT_UC) || !direct_reaches(op.length)) return false;
  MemoryAccess access(host_, target_.proc);
  if (!direct_target_receives()) return false;
  const host::SharedQp& qp = *target_.qp;
  // The QP's own queue, or its SRQ's (of the same process: an SRQ of an RC or
  // UC QP is never another process's), whose PD the receive SGEs are of.
  const bool srq = qp.srq_offset != 0;
  auto* rq = reinterpret_cast<host::SharedRq*>(target_.base + (srq ? qp.srq_offset : qp.rq_offset));
  if (srq && (rq->tag_list_offset != 0 || rq->limit.load(std::memory_order_acquire) != 0)) return false;
  const uint32_t receive_pd = srq ? rq->pd_id : qp.pd_id;
  uint64_t tail = rq->tail.load(std::memory_order_acquire);
  // The WQE at `tail`, posted by its mark (the line we read anyway) or, while
  // the mark is not there, by the head. It stays as it is while tail does
  // (its slot is reused only a ring later), so what is read here is what
  // the claim below takes.
  const host::RecvWqe* wqe = rq->posted_at(tail);
  if (wqe == nullptr) {
    if (tail == rq->head.load(std::memory_order_acquire)) return false;
    wqe = rq->slot(tail);
  }
  const uint64_t wr_id = wqe->wr_id;
  uint32_t num_sge = wqe->num_sge;
  if (num_sge > rq->max_sge) num_sge = rq->max_sge;
  if (num_sge > limits::kMaxSge) return false;
  iovec to[limits::kMaxSge];
  int nto = 0;
  uint64_t left = op.length;
  host::PeerBackings::View window{target_.backing, target_.backing_length};
  for (uint32_t i = 0; i < num_sge && left > 0; ++i) {
    // Each SGE read once, into a local: what is checked is what is used.
    // (One at a time rather than all at once: a copy of a length known only
    // here became `rep movs`, whose start-up cost more than the SEND's own
    // instructions.)
    const host::RecvSge sge = wqe->sge[i];
    if (sge.length == 0) continue;
    const uint64_t take = sge.length < left ? sge.length : left;
    // The key as the last SEND found it, while its slot has not changed.
    char* at = receive_grant_.find_current(host_.registry(), sge.lkey, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length);
    if (at == nullptr && (at = receive_range(sge, take, receive_pd, window)) == nullptr) return false;
    to[nto++] = iovec{at, static_cast<size_t>(take)};
    left -= take;
  }
  if (left != 0) return false;  // longer than the WQE: LOC_LEN_ERR, the general path's
  target_.backing = window.base;
  target_.backing_length = window.length;
  if (!rq->tail.compare_exchange_strong(tail, tail + 1, std::memory_order_acq_rel, std::memory_order_acquire))
    return false;
  const auto* from = static_cast<const unsigned char*>(op.local);
  for (int i = 0; i < nto; ++i) {
    copy_write(to[i].iov_base, from, to[i].iov_len);
    from += to[i].iov_len;
  }
  transport::ReceivedMessage message;
  message.op = op.kind == link::DirectCopy::Kind::kSendWithImm ? transport::Operation::kSendWithImm
                                                               : transport::Operation::kSend;
  message.src_qpn = op.src_qpn;
  message.solicited = op.solicited;
  message.imm_data = op.imm_data;
  const transport::ReceiveCompletion completion =
      transport::receive_completion(wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, op.length, message);
  // From its own queue the owner frees the slot without reading the tail.
  ShmResponderPort::complete_direct_receive(host_, target_, completion, srq ? nullptr : &tail);
  arm_send_lane(rq, srq, op.src_qpn);
  return true;
}

// The SEND lane asks what send_direct asked, of copies of what it read: the
// target (direct_reaches held), its receive queue (which stays while the
// target is this incarnation; an SRQ's has no tag list, which it never
// gains, and is asked for its limit at every SEND) and the grant of the
// receive key the SEND just used; the completions name the requester's
// QPN, `src_qpn`.
void ShmChannel::arm_send_lane(host::SharedRq* rq, bool srq, uint32_t src_qpn) {
  if (send_lane_ == nullptr) return;
  send_lane_->qp_type = qp_type_;
  send_lane_->src_qpn = src_qpn;
  send_lane_->self = host_.proc();
  send_lane_->host = &host_;
  send_lane_->target = target_;
  send_lane_->rq = rq;
  send_lane_->srq = srq;
  send_lane_->cq = reinterpret_cast<host::SharedCq*>(target_.base + target_.qp->recv_cq_offset);
  send_lane_->grant = receive_grant_;
  send_lane_->longest = kFenceChunk;
  send_lane_->armed = receive_grant_.key != 0 && (receive_grant_.access & IBV_ACCESS_LOCAL_WRITE) != 0;
}

class ShmLink final : public link::Link {
 public:
  explicit ShmLink(host::Attachment& host) : host_(host) {}

  std::unique_ptr<link::Channel> open_channel(const link::ChannelConfig& config) override {
    return std::make_unique<ShmChannel>(host_, config.qp_type, config.dest_qpn, config.memory_lane,
                                        config.send_lane);
  }

  void send_datagram(const link::Datagram& to, const transport::Request& request) override {
    unsigned char grh[wire::kUdGrhBytes];
    wire::build_ud_grh(grh, to.sgid, to.dgid, static_cast<uint32_t>(request.length), to.traffic_class,
                       to.hop_limit, to.flow_label);
    if (to.is_global && to.dest_qpn == wire::kMulticastQpn && wire::is_multicast_gid(to.dgid)) {
      // Multicast: a copy to every QP attached to the group on this host, the
      // sender's own QP included when it is attached (multicast loopback, as
      // rxe and mlx5 do and mckey expects) unless it was created with
      // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB.
      uint32_t members[host::kMaxMcastMembers];
      const uint32_t n = host_.registry().mcast_members(to.dgid, members);
      for (uint32_t i = 0; i < n; ++i)
        if (!to.block_self_multicast || members[i] != request.src_qpn) deliver(members[i], request, grh);
      return;
    }
    deliver(to.dest_qpn, request, grh);
  }

  // The virtual Ethernet segment is the host's: every process's flows are
  // in the host's raw flow table (host/raw_flows), so a frame reaches the raw
  // QPs of any process of the host whose flows match. Each process keeps a
  // FlowTable built from it, rebuilt when the table's generation moves.
  Result<void> attach_flow(uint64_t id, const transport::FlowTarget& target, const transport::FlowRule& rule) override {
    StoredFlow stored{};
    if (target.spread.size() > std::size(stored.spread)) return fail(std::errc::invalid_argument);
    stored.rule = rule;
    stored.qpn = target.qpn;
    stored.nspread = static_cast<uint32_t>(target.spread.size());
    std::copy(target.spread.begin(), target.spread.end(), stored.spread);
    stored.hash = target.hash;
    std::lock_guard guard(flows_lock_);
    host::RawFlows* table = raw_flows_locked();
    if (table == nullptr) return fail(std::errc::not_enough_memory);
    return table->add(host_.registry().identity_of(host_.proc()), id, &stored, sizeof stored, host_.registry());
  }

  // Once this returns no frame lands through the flow: a sender that picked
  // its QP before the removal either sees the new generation under its
  // MemoryAccess (and asks again) or is waited out by the fence here.
  void detach_flow(uint64_t id) override {
    {
      std::lock_guard guard(flows_lock_);
      if (host::RawFlows* table = raw_flows_locked()) table->remove(host_.registry().identity_of(host_.proc()), id);
    }
    host_.registry().fence_accesses(host_.proc());
  }

  void send_frame(const transport::Request& frame) override {
    // The headers flow steering looks at, gathered from the frame's pieces.
    unsigned char headers[transport::kFlowHeaderBytes];
    std::size_t have = 0;
    for (int i = 0; i < frame.ndata && have < sizeof headers; ++i) {
      const std::size_t n = std::min(frame.data[i].iov_len, sizeof headers - have);
      std::memcpy(headers + have, frame.data[i].iov_base, n);
      have += n;
    }
    transport::FrameKeys keys;
    if (!transport::parse_frame(std::span<const uint8_t>(headers, have), keys)) return;
    // Picked under the lock, delivered outside it (delivery copies into
    // other QPs' memory). Reused, so that a send allocates nothing.
    thread_local std::vector<uint32_t> receivers;
    host::RawFlows* table = nullptr;
    uint64_t picked_at = 0;  // the table generation the receivers were picked from
    {
      std::lock_guard guard(flows_lock_);
      table = raw_flows_locked();
      if (table == nullptr || !select_locked(*table, keys, frame.src_qpn, receivers)) return;
      picked_at = generation_;
    }
    for (const uint32_t qpn : receivers) {
      TargetQp target;
      if (!resolve(host_, qpn, target)) continue;
      MemoryAccess access(host_, target.proc);
      if (!still_there(target)) continue;
      // A flow destroyed since the pick (detach_flow fences after it bumps
      // the generation): the QP receives only if the table still says so.
      if (table->generation() != picked_at && !still_receives(*table, keys, frame.src_qpn, qpn)) continue;
      ShmResponderPort port(host_, target);
      transport::respond_frame(frame, port);
    }
  }

 private:
  void deliver(uint32_t qpn, const transport::Request& request, const unsigned char* grh) {
    TargetQp target;
    if (!resolve(host_, qpn, target)) return;
    MemoryAccess access(host_, target.proc);
    if (!still_there(target)) return;  // destroyed meanwhile: the datagram is lost, as UD allows
    ShmResponderPort port(host_, target);
    transport::respond_datagram(request, std::span<const unsigned char>(grh, wire::kUdGrhBytes), port);
  }

  // A flow as the host's table stores it (opaque bytes there).
  struct StoredFlow {
    transport::FlowRule rule;
    uint32_t qpn;
    uint32_t nspread;
    uint32_t spread[256];
    transport::RxHash hash;
  };
  static_assert(std::is_trivially_copyable_v<StoredFlow> && sizeof(StoredFlow) <= host::kRawFlowPayloadBytes);

  // The receivers of a frame, into `out`, from the table as it is now;
  // false when there are none.
  bool select_locked(host::RawFlows& table, const transport::FrameKeys& keys, uint32_t sender_qpn,
                     std::vector<uint32_t>& out) {
    out.clear();
    if (table.generation() != generation_ || !owners_running_locked()) rebuild_locked(table);
    if (flows_.empty()) return false;
    flows_.select(keys, sender_qpn, out);
    return !out.empty();
  }

  bool still_receives(host::RawFlows& table, const transport::FrameKeys& keys, uint32_t sender_qpn, uint32_t qpn) {
    thread_local std::vector<uint32_t> now;
    std::lock_guard guard(flows_lock_);
    select_locked(table, keys, sender_qpn, now);
    return std::find(now.begin(), now.end(), qpn) != now.end();
  }

  host::RawFlows* raw_flows_locked() {
    if (!raw_flows_ && !raw_flows_failed_) {
      auto table = host::RawFlows::open();
      if (table) {
        raw_flows_.reset(*table);
      } else {
        raw_flows_failed_ = true;
        SOFTHCA_WARN("raw flow table cannot be opened: raw packet qps receive nothing");
      }
    }
    return raw_flows_.get();
  }

  // Whether process `pid`, in registry slot `proc`, still runs: its
  // segment is still its own (a newcomer may have the slot) and its
  // progress thread holds owner_alive. Loads only, no system call.
  bool running(uint32_t proc, uint32_t pid) {
    const char* base = host_.segment_base(proc);
    if (base == nullptr) return false;
    const auto* header = reinterpret_cast<const host::SegmentHeader*>(base);
    return header->pid == pid && header->owner_running();
  }

  // Whether every process whose flows flows_ holds still lives. A killed
  // process changes nothing in the table (its entries go when the table
  // fills), yet its flows must stop taking frames at once: a trapping one
  // would keep them from the live processes' flows below it.
  bool owners_running_locked() {
    for (const Owner& owner : owners_)
      if (!running(owner.proc, owner.pid)) return false;
    return true;
  }

  void rebuild_locked(host::RawFlows& table) {
    table.snapshot(snapshot_, host_.registry(), generation_);
    flows_ = transport::FlowTable{};
    owners_.clear();
    uint64_t key = 0;
    for (const host::RawFlowEntry& e : snapshot_) {
      if (e.payload_len != sizeof(StoredFlow)) continue;
      // The same test as owners_running_locked (snapshot's own, by pid, says
      // a killed process that is not yet reaped is alive), so that a dead
      // owner does not have every frame rebuild the table.
      if (!running(e.proc, e.pid)) continue;
      const Owner owner{e.proc, e.pid};
      if (std::find(owners_.begin(), owners_.end(), owner) == owners_.end()) owners_.push_back(owner);
      StoredFlow stored;
      std::memcpy(&stored, e.payload, sizeof stored);
      transport::FlowTarget target{stored.qpn, {stored.spread, stored.spread + std::min<uint32_t>(stored.nspread, 256)},
                                   stored.hash};
      flows_.add(++key, std::move(target), stored.rule);
    }
  }

  host::Attachment& host_;
  std::mutex flows_lock_;
  std::unique_ptr<host::RawFlows> raw_flows_;
  bool raw_flows_failed_ = false;
  uint64_t generation_ = 0;
  std::vector<host::RawFlowEntry> snapshot_;
  transport::FlowTable flows_;
  struct Owner {
    uint32_t proc;
    uint32_t pid;
    bool operator==(const Owner&) const = default;
  };
  std::vector<Owner> owners_;  // the processes whose flows flows_ holds
};

}  // namespace
}  // namespace softhca::shm

namespace softhca::link {

std::unique_ptr<Link> make_shm_link(host::Attachment& host) { return std::make_unique<shm::ShmLink>(host); }

}  // namespace softhca::link
