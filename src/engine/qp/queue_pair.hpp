// A queue pair (RC, UC, UD). The send queue is local to this process: post_send
// copies each work request into it and the send queue executes them in order,
// right away, through its link (link/link.hpp; on the shm link the initiator
// performs the whole operation on the target's shared state), and the
// completer (transport/completer.hpp) decides what the answer means. A WQE
// that cannot finish now (RNR, no response) is parked until its deadline;
// poll_cq, later posts and the node's progress thread retry it. The receive queue and the responder-visible
// state live in the process segment so initiators elsewhere can use them.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/biased_lock.hpp"
#include "common/counters.hpp"
#include "common/result.hpp"
#include "common/futex_mutex.hpp"
#include "common/prefetch.hpp"
#include "common/spinlock.hpp"
#include "engine/context.hpp"
#include "engine/qp/foreign_memory.hpp"
#include "engine/qp/qp_state.hpp"
#include "engine/qp/send_wqe.hpp"
#include "engine/user_count.hpp"
#include "host/host_registry.hpp"
#include "host/peer_backings.hpp"
#include "host/shared_queues.hpp"
#include "link/key_grant.hpp"
#include "link/link.hpp"
#include "link/shm/memory_lane.hpp"
#include "link/shm/send_lane.hpp"
#include "transport/completer.hpp"

namespace softhca::host {
struct TgtQpRecord;
}

namespace softhca::engine {

class CompletionQueue;
class ProtectionDomain;
class SharedReceiveQueue;
class XrcDomain;

struct QpInitAttr {
  ibv_qp_type type;
  CompletionQueue* send_cq;
  CompletionQueue* recv_cq;
  SharedReceiveQueue* srq;
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
  bool sq_sig_all;
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (UD): the QP's own multicast sends do
  // not come back to it even when it is attached to the group.
  bool block_self_multicast = false;
  // XRC_RECV (TGT) QPs: their domain. They have no PD, CQs or queues of
  // their own; each message names the XRC SRQ that receives it.
  XrcDomain* xrcd = nullptr;
  // RSS (raw packet QPs made with an indirection table): no queues or CQs
  // of its own; its flows spread frames over these work queues (their
  // QPNs, a power of two of them) by `rx_hash`.
  std::vector<uint32_t> rss_spread;
  transport::RxHash rx_hash;
};

class QueuePair {
 public:
  // `pd` is nullptr only for XRC_RECV QPs.
  static Result<QueuePair*> create(Context& context, ProtectionDomain* pd, QpInitAttr& init);
  // ibv_open_qp: another handle to the XRC_RECV (TGT) QP `qpn` of domain
  // `xrcd`, which any process of the host may have created. A TGT QP is the
  // host's (host::TgtQpRecord): every handle modifies, queries and gets the
  // events of the same QP, which lives while any handle does
  // (engine/qp/tgt_qp.cpp).
  static Result<QueuePair*> open(Context& context, XrcDomain& xrcd, uint32_t qpn);
  ~QueuePair();

  Result<void> modify(const ibv_qp_attr& attr, int mask);
  void query(ibv_qp_attr& attr, ibv_qp_init_attr& init);
  int post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

  // Retries parked work whose deadline has passed.
  void progress(uint64_t now_ns);
  // An asynchronous link has answers for this QP's send WQEs (link thread).
  void take_answers();
  uint64_t next_deadline();
  // The progress thread relays an event another process raised on this QP.
  void on_remote_event(uint32_t detail);
  // A TGT QP's handle: another handle changed which one serves the QP's
  // peer on another host, or the QP's state; this handle opens or drops its
  // udp channel to match (the progress thread calls it).
  void sync_tgt_channel();

  uint32_t qpn() const { return qpn_; }
  ibv_qp_type type() const { return init_.type; }
  ibv_qp_state state() const { return static_cast<ibv_qp_state>(shared_->state.load(std::memory_order_acquire)); }
  Context& context() { return context_; }
  ProtectionDomain* pd() { return pd_; }
  const QpInitAttr& init_attr() const { return init_; }
  const QpAttributes& attrs() const { return attrs_; }
  uint32_t id() const { return id_; }
  // Where the frames of this QP's flows go: the QP, or its work queues.
  transport::FlowTarget flow_target() const { return {qpn_, init_.rss_spread, init_.rx_hash}; }

  // ibv_attach_mcast / ibv_detach_mcast of a UD QP: `mgid` is 16 bytes.
  Result<void> attach_multicast(const uint8_t* mgid);
  Result<void> detach_multicast(const uint8_t* mgid);

  // The application's ibv_qp, set once the verb that made the QP returns to
  // it. Atomic: another process may raise an event on the QP (a TGT QP's
  // handles get them all) before this process does anything with it, and
  // the progress thread reads it then.
  std::atomic<void*> handle{nullptr};
  EventCounters async_events;
  // The flows steering frames to this QP (engine/flow.hpp): ibv_destroy_qp
  // refuses (EBUSY) while any is attached, as the kernel does.
  UserCount flows;

  // The owner polled a completion of this QP (CompletionQueue::poll). A send
  // WQE's slot stays taken until its completion, or a later one of the same
  // send queue, is polled; a receive WQE's until its completion is polled.
  // Stale positions (a completion of an earlier QP that had this QPN) are ignored.
  // Both run under the poll lock of the CQ that held the completion.
  void retire_send(uint32_t position);
  // `taken_at`: the low 32 bits of the WQE's position in the receive queue,
  // where its completion said (host::kCqeRecvPosition); nullptr where not.
  void retire_recv(const uint32_t* taken_at = nullptr);

  Node& node() { return node_; }

  // EINVAL for a WR that ibv_post_send refuses. Inline: the common shapes
  // (one SGE, an opcode of the QP's type other than a bind, an invalidation
  // or an atomic write, not UD) are answered from two masks; the rest asks
  // validate_send_general, which gives the same answer for these too
  // (public for the test that holds them to it).
  int validate_send(const ibv_send_wr& wr) const {
    const bool inline_data = (wr.send_flags & IBV_SEND_INLINE) != 0;
    const uint32_t common = inline_data ? common_inline_opcodes_ : common_opcodes_;
    const uint32_t opcode = send_opcode_of(wr);
    if (opcode < 32 && ((common >> opcode) & 1) != 0 && wr.num_sge == 1 && wr.sg_list != nullptr &&
        (!inline_data || wr.sg_list[0].length <= init_.max_inline_data))
      return 0;
    return validate_send_general(wr);
  }
  int validate_send_general(const ibv_send_wr& wr) const;

 private:
  QueuePair(ProtectionDomain* pd, Context& context, const QpInitAttr& init);
  SendWqe* sq_slot(uint32_t index) { return reinterpret_cast<SendWqe*>(sq_.data() + uint64_t{index & (sq_capacity_ - 1)} * sq_stride_); }
  void enqueue_send_locked(const ibv_send_wr& wr);
  // The common case done on the spot (direct_send.cpp): one RC WRITE, READ,
  // atomic or SEND of one local range, the send queue idle, and a link that
  // completes it at once (link::Channel::copy_direct). False: nothing happened, the WR
  // goes the general way.
  bool post_direct_locked(const ibv_send_wr& wr);
  // post_direct_locked for an RDMA WRITE of one SGE (link::Channel::write_direct).
  bool post_write_direct_locked(const ibv_send_wr& wr);
  // post_write_direct_locked on the memory lane, when it is armed: the same
  // conditions, of what the last direct WRITE or READ found (queue_pair.cpp,
  // inlined into post_send).
  bool post_write_on_lane_locked(const ibv_send_wr& wr);
  // What every lane asks first: a valid WR, the QP in RTS, idle, with room.
  bool lane_takes_locked(const ibv_send_wr& wr) const;
  // post_direct_locked's READ of one SGE on the memory lane, when it is armed.
  bool post_read_on_lane_locked(const ibv_send_wr& wr);
  // post_direct_locked's SEND on the SEND lane, when it is armed.
  bool post_on_send_lane_locked(const ibv_send_wr& wr);
  // Completes the WQE of `wr`, done on the spot, as acknowledged.
  void complete_direct_locked(const ibv_send_wr& wr, uint64_t length);
  // complete_direct_locked for a direct RDMA WRITE that landed at `landed`
  // (this process's view of the target), remembered for the next WRITE's
  // prefetch.
  void complete_direct_write_locked(const ibv_send_wr& wr, void* landed) {
    last_direct_addr_.store(wr.wr.rdma.remote_addr, std::memory_order_relaxed);
    last_direct_landed_.store(landed, std::memory_order_relaxed);
    complete_direct_locked(wr, wr.sg_list[0].length);
  }
  // A WRITE or atomic to the address the last direct one went to (a
  // ping-pong's) prefetches the line it landed on for writing, before the
  // send lock and the checks: the line's trip from the core that waits on
  // it overlaps them. Only a hint (common/prefetch.hpp): read without the
  // lock, it may be stale, which costs a useless prefetch and nothing else.
  void prefetch_for_direct(const ibv_send_wr& wr) const {
    uint64_t remote_addr;
    switch (send_opcode_of(wr)) {
      case IBV_WR_RDMA_WRITE:
        remote_addr = wr.wr.rdma.remote_addr;
        break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
      case IBV_WR_ATOMIC_CMP_AND_SWP:
        remote_addr = wr.wr.atomic.remote_addr;
        break;
      default:
        return;
    }
    if (remote_addr != last_direct_addr_.load(std::memory_order_relaxed)) return;
    if (const void* line = last_direct_landed_.load(std::memory_order_relaxed)) prefetch_for_write(line);
  }
  char* direct_local_range(const ibv_sge& sge, uint32_t needed);
  // now_ns == 0: the caller did not read the clock; it is read only where a
  // deadline is involved (here and in execute_locked).
  void progress_locked(uint64_t now_ns);
  // Sends the WQE at `position` through its link (requester.cpp): the
  // completer's verdict, or (an asynchronous link) in flight, or no room.
  struct Step {
    enum class Kind { kVerdict, kInFlight, kNoRoom };
    Kind kind = Kind::kVerdict;
    transport::Verdict verdict;
    // Tag matching: the responder READ this SEND's rendezvous data; a FIN
    // for our receive queue, after the SEND's completion.
    bool rendezvous_fin = false;
    uint64_t fin_tag = 0;
    uint32_t fin_app_ctx = 0;
  };
  Step execute_locked(SendWqe& wqe, uint32_t position, uint64_t now_ns);
  // Opens the channel to the peer at RTR, over the link that reaches it.
  void open_channel_locked();
  // Whether the address is reached through the udp link (another host, or
  // SOFTHCA_LINK=udp) rather than shared memory.
  static bool reaches_other_host(const QpAddressVector& ah);
  // Returns the status it completed with: a WQE whose data could not be
  // scattered into another process's memory ends LOC_PROT_ERR instead.
  ibv_wc_status complete_send_locked(const SendWqe& wqe, ibv_wc_status status);
  // Tag matching: the FIN of a rendezvous this QP sent, into its next
  // receive WQE (RECV completion; dropped when there is none).
  void deliver_fin_locked(uint64_t tag, uint32_t app_ctx);
  void enter_error_locked();
  void flush_send_locked();
  // The WQE at the tail is done with `status`: moves the tail past it and
  // writes its completion if it needs one (always, unless it succeeded
  // unsignaled). complete_send_locked also logs an error status.
  void finish_send_locked(const SendWqe& wqe, ibv_wc_status status);
  void flush_recv();
  void reset_queues_locked();
  void publish_responder_state();
  // check_modify_qp against this QP's attributes and the device (under sq_lock_).
  Result<void> check_modify_locked(const ibv_qp_attr& attr, int mask) const;
  void raise_event(ibv_event_type type);
  // TGT QPs (tgt_qp.cpp): the attributes are the host record's, read and
  // written under the registry mutex; the udp channel is the serving handle's.
  Result<void> create_tgt(Node& node);
  Result<void> modify_tgt(const ibv_qp_attr& attr, int mask);
  void load_tgt_attributes();   // under the registry mutex
  void store_tgt_attributes();  // under the registry mutex
  bool serves_tgt() const;      // under the registry mutex
  void leave_tgt();
  bool signaled(const SendWqe& wqe) const { return init_.sq_sig_all || (wqe.send_flags & IBV_SEND_SIGNALED) != 0; }
  // This QP's counters and its port's (this process's share of them).
  CounterSink counters() const;

  ProtectionDomain* pd_;  // nullptr for XRC_RECV
  Context& context_;
  Node& node_;
  QpInitAttr init_;
  // Bit n set: opcode n is one this QP's type posts (validate_send's first
  // question, asked of every WR).
  uint32_t send_opcodes_ = 0;
  // Those validate_send answers without the general questions (none on
  // UD, whose WRs name an address handle, nor without room for one SGE),
  // and those of them that may be inline (not READ or an atomic).
  uint32_t common_opcodes_ = 0;
  uint32_t common_inline_opcodes_ = 0;
  QpAttributes attrs_;
  uint32_t qpn_ = 0;
  uint32_t id_ = 0;
  uint64_t shared_offset_ = 0;
  host::SharedQp* shared_ = nullptr;
  // A TGT QP's record in the host registry (its shared_ is in it), else nullptr.
  host::TgtQpRecord* tgt_ = nullptr;
  uint64_t rq_offset_ = 0;
  uint64_t rq_bytes_ = 0;
  host::SharedRq* rq_ = nullptr;

  // A mutex, not a spinlock: over the udp link the send path sends packets
  // (system calls) under it, and the link's thread takes it to complete
  // WQEs; a poster spinning meanwhile burned the core that thread needed.
  // Biased: the thread that posts alone takes it without a locked instruction.
  BiasedLock<FutexMutex> sq_lock_;
  std::vector<unsigned char> sq_;
  uint32_t sq_stride_ = 0;
  uint32_t sq_capacity_ = 0;  // power of two >= max_send_wr
  // Positions in the send queue (free-running, from a random start so that a
  // stale completion of an earlier QP with this QPN names no live WQE):
  // retired <= tail <= head. [retired, tail) executed, completion not yet
  // polled; [tail, head) waiting to execute.
  uint32_t sq_head_ = 0;                  // next free slot
  std::atomic<uint32_t> sq_tail_{0};      // oldest unfinished WQE (written under sq_lock_)
  // tail <= sent <= head: [tail, sent) handed to an asynchronous link and in
  // flight; a synchronous link keeps sent == tail.
  uint32_t sq_sent_ = 0;
  std::atomic<uint32_t> sq_retired_{0};   // oldest slot still taken
  std::atomic<uint64_t> rq_retired_{0};   // receive WQEs whose completion was polled
  std::atomic<uint64_t> rq_taken_floor_{0};  // never past rq_->tail: retire_recv reads it instead
  bool parked_ = false;
  BiasedLock<SpinLock> rq_lock_;  // biased as sq_lock_ is
  // The memory lane (link/shm/memory_lane.hpp), which a shm channel arms
  // and disarms (under sq_lock_). Declared before channel_: it outlives it.
  shm::MemoryLane memory_lane_;
  shm::SendLane send_lane_;  // link/shm/send_lane.hpp, the same way
  // RC/UC: the path to the peer QP, opened at RTR, dropped at RESET (under sq_lock_).
  std::unique_ptr<link::Channel> channel_;
  host::MrLookupCache direct_local_key_;  // post_direct_locked's last lkey (under sq_lock_)
  // ... and this process's backing file as mapped here, where that MR's
  // pages moved: a window stays mapped for the process's life (outgrown
  // ones too, host::PeerBackings), so it is kept rather than looked up.
  host::PeerBackings::View direct_local_window_;
  link::KeyGrant direct_local_grant_;  // what direct_local_key_ grants (link/key_grant.hpp)
  // prefetch_for_direct's hint: the remote address of the last direct WRITE
  // or atomic, and where it landed here (relaxed: read before the lock).
  std::atomic<uint64_t> last_direct_addr_{0};
  std::atomic<const void*> last_direct_landed_{nullptr};
  bool attached_ = false;  // holds its PD, CQs and SRQ: creation completed
  // Local SGEs in other processes' memory, staged here, by the position of
  // their send WQE until it completes (engine/qp/foreign_memory.hpp). Last:
  // seldom used, it keeps off the lines of the fields every post touches.
  std::unordered_map<uint32_t, ForeignStaging> staging_;
};

}  // namespace softhca::engine
