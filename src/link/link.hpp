// The link interface: how the engine sends a message to a peer QP, whatever
// carries it. The engine talks to links only through this header; a link
// runs the IBTA responder (src/transport) for the messages it delivers and
// returns its syndrome, which the engine's completer turns into a completion.
//
//  - shm (link/shm): the peer is on this host; the initiator executes the
//    responder itself on the peer's shared state and memory.
//  - udp (link/udp): RoCEv2 packets to another host, whose responder answers
//    in an AETH; the answer comes later, from the link's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "common/counters.hpp"
#include "common/result.hpp"
#include "transport/flow_steering.hpp"
#include "transport/request.hpp"
#include "transport/responder.hpp"

namespace softhca::host {
class Attachment;
}
namespace softhca::shm {
struct MemoryLane;
struct SendLane;
}

namespace softhca::link {

// What a connected QP's channel is opened with (at RTR).
struct ChannelConfig {
  uint32_t local_qpn = 0;
  uint32_t qp_type = 0;          // IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_XRC_SEND or IBV_QPT_XRC_RECV
  uint32_t dest_qpn = 0;
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint32_t flow_label = 0;
  // An IPv6 link-local sgid's interface: the scope such an address needs to
  // be sent from and to (0: a global address, the kernel's route decides).
  uint32_t ifindex = 0;
  uint32_t mtu = 1024;           // the path MTU in bytes
  uint32_t rq_psn = 0;
  uint32_t max_dest_rd_atomic = 0;
  // The QP's counters (in its SharedQp); the link adds the port's.
  Counters* qp_counters = nullptr;
  // Called from the link's thread, with no lock of the link held, when the
  // channel has answers to take (next_answer). It must not call back into
  // the channel there; the engine takes them under its own lock
  // (QueuePair::take_answers). It may run after the channel is gone.
  std::function<void()> on_answers;
  // The QP's memory lane (link/shm/memory_lane.hpp), which a channel of the
  // shm link arms after a direct WRITE and disarms when its target changes
  // or it is destroyed; nullptr: none. Under the QP's send lock.
  shm::MemoryLane* memory_lane = nullptr;
  // The QP's SEND lane (link/shm/send_lane.hpp), armed after a direct SEND,
  // as the memory lane is after a direct WRITE or READ.
  shm::SendLane* send_lane = nullptr;
};

// What the requester side needs once the QP reaches RTS.
struct SendConfig {
  uint32_t sq_psn = 0;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t timeout = 14;
  uint32_t max_rd_atomic = 16;   // READs and atomics in flight at once
};

// A finished send WQE, as an asynchronous channel reports it.
struct Answer {
  uint32_t position = 0;  // the WQE's position in the send queue
  ibv_wc_status status = IBV_WC_SUCCESS;
};

// An RC WRITE, READ, atomic or SEND of one local range that a channel may
// complete on the spot (Channel::copy_direct, Channel::send_direct).
struct DirectCopy {
  enum class Kind { kWrite, kRead, kFetchAdd, kCompareSwap, kSend, kSendWithImm };
  Kind kind = Kind::kWrite;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  void* local = nullptr;    // this process's memory, already checked (an atomic's: 8 bytes, its original value)
  uint64_t length = 0;      // > 0; 8 for an atomic
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // SENDs: what the receive completion reports.
  uint32_t src_qpn = 0;
  uint32_t imm_data = 0;
  bool solicited = false;
  // Out: where a WRITE's or an atomic's bytes landed in this process's view
  // of the target (set when copy_direct says true), for the requester's
  // prefetch of the next operation to the same address (common/prefetch.hpp).
  const void* landed = nullptr;
};

// A connected QP's (RC or UC) path to its peer, opened when the QP moves to
// RTR and dropped when it is reset. Used under the QP's send lock only.
class Channel {
 public:
  virtual ~Channel() = default;
  // Delivers one message; returns the responder's answer (for UC, whatever it
  // is, the requester completes: UC has no acknowledgements). An
  // asynchronous channel returns `pending` (the WQE stays in flight; its
  // answer comes through next_answer) or `busy` (no room now: try again
  // after answers came). `position` names the WQE in its send queue and
  // `local` keeps pointing at its buffers until it is answered.
  virtual transport::Response deliver(const transport::Request& request, uint32_t position) = 0;
  // The common case without the general responder: true when the copy is
  // done and the responder would have acknowledged it, with no other effect
  // than deliver() would have had (no error, no event, no counter, no
  // receive WQE). False: nothing happened, and the caller delivers the
  // message the general way, which gives every other outcome. Only a link
  // that runs the responder in the requester's thread can say true.
  virtual bool copy_direct(DirectCopy&) { return false; }
  // copy_direct for an RDMA WRITE, with its four operands as arguments: where
  // its `length` bytes from `local` landed in this process's view of the
  // target, or nullptr (nothing happened). The latency tests' operation, on
  // their critical path (from the peer's signal to this store), so it takes
  // no DirectCopy to fill and no dispatch on the kind.
  virtual void* write_direct(const void* /*local*/, uint64_t /*length*/, uint64_t /*remote_addr*/,
                             uint32_t /*rkey*/) {
    return nullptr;
  }
  // copy_direct for a SEND or SEND_WITH_IMM (a function of its own: the
  // SEND's checks and the one-sided operations' share nothing but the
  // target, and one entry for both cost the SEND a dispatch on the kind).
  virtual bool send_direct(const DirectCopy&) { return false; }
  // The QP reached RTS: it may send from sq_psn on.
  virtual void start_sending(const SendConfig&) {}
  // The next answer of an asynchronous channel, in posting order.
  virtual bool next_answer(Answer&) { return false; }
  // The QP went to ERROR: drop everything in flight (the engine flushes it).
  virtual void abort() {}
};

// Where a UD message goes, as the engine resolved its address handle.
struct Datagram {
  uint32_t dest_qpn = 0;         // or 0xFFFFFF for a multicast group
  bool is_global = false;
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint32_t flow_label = 0;
  bool block_self_multicast = false;  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
  uint32_t ifindex = 0;               // the interface of sgid: a group's datagrams leave through it
  Counters* qp_counters = nullptr;    // the sending QP's
};

// Management datagrams: MADs to and from QP1, the general services
// interface (GSI), which carries the connection manager's messages between
// hosts. Every GSI packet has Q_Key 0x80010000 and comes from QP1.
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;
inline constexpr std::size_t kMadBytes = 256;

// One MAD that arrived at this host's QP1.
struct ManagementDatagram {
  uint8_t sgid[16] = {};  // the sender's address (as a GID)
  uint8_t dgid[16] = {};  // ours, as the sender addressed it
  uint32_t src_qpn = 0;   // the sender's QP (1 for a CM)
  std::span<const uint8_t> mad;
};

// Takes one arriving MAD. Called from whichever thread receives packets
// (the link's, or an application's inside poll()), with locks of the link
// held: it must only copy the MAD somewhere and return, never call into the
// link.
using ManagementReceiver = std::function<void(const ManagementDatagram&)>;

class Link {
 public:
  virtual ~Link() = default;
  // The channel of a connected QP to its peer; nullptr if this link cannot
  // open one now (the QP then reaches nobody: RETRY_EXC_ERR).
  virtual std::unique_ptr<Channel> open_channel(const ChannelConfig& config) = 0;
  // Sends one UD message to a QP or a multicast group; one that cannot be
  // delivered is lost, as UD allows.
  virtual void send_datagram(const Datagram& to, const transport::Request& request) = 0;
  // Processes, in the calling thread, what has arrived and is due (a link
  // with a thread of its own would otherwise wait for a core while the
  // application busy-polls). Cheap when there is nothing. False when it
  // had nothing to look at (the link idle): nothing can have completed.
  virtual bool poll() { return false; }
  // An application thread is about to sleep until a completion event (it
  // armed a CQ): whatever poll() took over, the link's own thread does again.
  virtual void pollers_rest() {}
  // Makes sure this process receives what peers send it over this link (a
  // UD QP can be sent to by anyone, before it sends anything itself).
  virtual void listen() {}
  // Sends one MAD from this host's QP1 at `sgid` to QP1 of the host at
  // `dgid`. Like any datagram, it may be lost; the sender retries.
  virtual void send_management(const uint8_t* /*sgid*/, const uint8_t* /*dgid*/, std::span<const uint8_t> /*mad*/) {}
  // Installs this process's receiver of the MADs that reach its QP1, and
  // makes the process receive them (listen). MADs that reach a process
  // with no receiver are handed to the host's GSI agent (the process that
  // installed one first and still runs), which passes each on to whichever
  // process it concerns. An empty receiver uninstalls.
  virtual void receive_management(ManagementReceiver) {}
  // Makes this process receive the datagrams other hosts send to the IP
  // multicast group of `mgid` (an IPv4-mapped 224.0.0.0/4 address or an
  // IPv6 ff00::/8 one) on interface `ifindex`, until as many leave_group
  // calls as join_group ones came. Best effort, as a switch's membership
  // is: a group that cannot be joined is logged and stays host-only.
  virtual void join_group(const uint8_t* /*mgid*/, uint32_t /*ifindex*/) {}
  virtual void leave_group(const uint8_t* /*mgid*/, uint32_t /*ifindex*/) {}
  // Raw packet QPs: the port's virtual Ethernet segment. A flow (`id`, unique
  // in the process) steers the frames its rule matches to its target (a QP,
  // or one of an RSS QP's work queues);
  // send_frame hands one frame (a raw QP's SEND: `request.data`, with
  // `request.src_qpn` the sender) to every QP flow steering picks
  // (transport/flow_steering.hpp). A frame nobody takes is dropped.
  // attach_flow: ENOMEM when the segment holds as many flows as it can.
  virtual Result<void> attach_flow(uint64_t /*id*/, const transport::FlowTarget& /*target*/,
                                   const transport::FlowRule& /*rule*/) {
    return fail(std::errc::operation_not_supported);
  }
  virtual void detach_flow(uint64_t /*id*/) {}
  virtual void send_frame(const transport::Request& /*frame*/) {}
};

// The shared-memory link of this host, over this process's attachment.
std::unique_ptr<Link> make_shm_link(host::Attachment& host);

// The udp link (RoCEv2 over UDP port 4791) of this process, with its own
// thread, started at the first channel or datagram that needs it.
std::unique_ptr<Link> make_udp_link(host::Attachment& host);

}  // namespace softhca::link
