// The requester and completer of a reliable (RC) or unreliable (UC)
// connection over packets, pure: messages go out segmented at the path MTU,
// one PSN per packet (a READ takes one per response packet); ACKs complete
// them in order, a later ACK completing earlier messages implicitly; NAKs
// end them in error; a PSN-sequence NAK or the ACK timer sends again from the
// first unacknowledged packet (go-back-N); an RNR NAK waits the responder's
// timer. READ responses are scattered into the local SGEs as they arrive;
// an atomic's original value lands there from the atomic ACK.
//
// No clock and no I/O: `now` comes in, packets go out through a PacketSink,
// completions are popped by the owner. Used under its owner's lock.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <cstdint>
#include <deque>

#include "common/counters.hpp"
#include "common/limits.hpp"
#include "transport/packet_sink.hpp"
#include "transport/request.hpp"
#include "wire/packet.hpp"

namespace softhca::transport {

// One send WQE as the requester transmits it.
struct OutgoingMessage {
  uint32_t position = 0;  // the WQE's position in its send queue
  Operation op = Operation::kSend;
  bool solicited = false;
  uint32_t imm_data = 0;  // network byte order
  uint32_t invalidate_rkey = 0;  // kSendWithInv: goes in the last packet's IETH
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint32_t xrc_srqn = 0;  // XRC: the responder's SRQ, in every packet's XRCETH
  // The local buffers: the payload of a SEND or WRITE, where a READ's data
  // or an atomic's original value goes. They stay valid until completion.
  iovec local[limits::kMaxSge + 1] = {};
  int nlocal = 0;
  uint64_t length = 0;
};

struct RequesterConfig {
  uint32_t dest_qpn = 0;
  uint32_t mtu = 1024;
  bool reliable = true;      // RC; UC completes each message once it is sent
  bool xrc = false;          // an XRC INI QP: RC's protocol with XRC opcodes and an XRCETH
  uint32_t start_psn = 0;    // sq_psn
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t timeout = 14;      // IBTA code: 4.096 us * 2^timeout; 0 = wait for ever
  // READs and atomics in flight at once (the QP's max_rd_atomic): the
  // responder keeps only as many (its max_dest_rd_atomic) to answer again.
  uint32_t max_rd_atomic = 16;
  CounterSink counters;      // retransmissions, timeouts, NAKs received
  // Recover selectively from a responder that keeps packets past a gap
  // (selective.hpp); RC only.
  bool selective = false;
};

struct RequesterCompletion {
  uint32_t position = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
};

class RequesterFlow {
 public:
  explicit RequesterFlow(const RequesterConfig& config);

  // Whether another message may go out now (the window is not full).
  bool has_room() const;
  void post(const OutgoingMessage& message, uint64_t now_ns, PacketSink& out);
  // An ACK, NAK, atomic ACK or READ response addressed to this QP.
  void on_response(const wire::ParsedPacket& packet, uint64_t now_ns, PacketSink& out);
  // The ACK or RNR timer: call when now_ns >= deadline().
  void on_timer(uint64_t now_ns, PacketSink& out);
  // When on_timer is due; 0 for never.
  uint64_t deadline() const { return probe_at_ != 0 && probe_at_ < deadline_ ? probe_at_ : deadline_; }
  // Completions in posting order.
  bool pop_completion(RequesterCompletion& out);
  // A completion in error ended the flow: the QP goes to ERROR.
  bool failed() const { return failed_; }
  // Drops every outstanding message without completing it (the QP flushes them).
  void abort();

  uint32_t next_psn() const { return next_psn_; }
  uint32_t window_packets() const { return window_; }
  // The most packets unacknowledged at once: 128, or towards a responder
  // that keeps packets past a gap what it keeps (selective.hpp).
  uint32_t max_window() const;

 private:
  struct Outstanding {
    OutgoingMessage message;
    uint32_t first_psn = 0;
    uint32_t npsn = 0;          // PSNs it takes (READ: its response packets)
    uint32_t read_next = 0;     // READ: the next response PSN expected
    uint32_t read_asked = 0;    // READ: the PSN its latest request asked from
    uint32_t read_seen = 0;     // READ: the PSN of the latest response packet
    uint32_t read_asked_end = 0;  // READ: the PSN after the last one its latest request asked for
    // READ or atomic: when an ACK that passed it with no response last made
    // the requester ask again (0: never since its last response). Further
    // such ACKs ask again no sooner than kAskAgainAfterNs later.
    uint64_t asked_again_ns = 0;
    uint32_t responses_since_ask = 0;    // READ: response packets since its latest request
    bool asked_one = false;              // READ: a marked probe asked for it before any response
    uint32_t last_psn() const;
  };

  bool is_read_or_atomic(const Outstanding& o) const;
  // Whether a READ response packet of `segment` may stand at `psn` of `read`.
  static bool starts_and_ends_right(const Outstanding& read, uint32_t psn, wire::Segment segment);
  // Sends packet `index` of `o` (a READ or atomic: its one request).
  // Hands one request packet to `out`: as built (RC, UC), or for an XRC QP
  // with the XRC twin of its opcode and the message's XRCETH.
  void send_packet(wire::Headers& h, const OutgoingMessage& m, PacketSink& out, const iovec* payload, int npayload,
                   uint32_t length) const;
  void transmit_packet(Outstanding& o, uint32_t index, uint64_t now_ns, PacketSink& out);
  // Sends what the window allows, from send_psn_ on.
  void pump(uint64_t now_ns, PacketSink& out);
  // Go-back-N: the next packet sent is `psn`'s (a READ or atomic from its first PSN).
  void retransmit_from(uint32_t psn, uint64_t now_ns, PacketSink& out);
  void advance_una(uint32_t psn_after);
  void sent_through(uint32_t psn_after);
  // Completes, in order, the messages an ACK of `psn` covers; a READ or
  // atomic among them whose response never came is sent again instead.
  void acknowledge_through(uint32_t psn, uint64_t now_ns, PacketSink& out);
  void complete_front(ibv_wc_status status);
  void fail_front(ibv_wc_status status);
  void progress_made(uint64_t now_ns);
  void arm_ack_timer(uint64_t now_ns);
  // After a loss: at most `packets` in flight from now (never below the least window).
  void shrink_window(uint32_t packets);
  // What the path holds, in packets: the fastest recent delivery rate times
  // the least round trip seen (0 until a round trip was timed).
  uint32_t path_packets() const;
  void time_round_trip(uint32_t psn, uint64_t now_ns);
  void round_trip_answered(uint64_t now_ns);
  // Sends again the packets of PSNs [first, first + count) that went out
  // before (selective recovery: a hole report, the tail probe).
  void resend_range(uint32_t first, uint32_t count, uint64_t now_ns, PacketSink& out);
  // The tail probe towards a go-back-N responder: the newest packet sent,
  // again, asking for an ACK. A responder that has it (it or its ACK was
  // merely late) acknowledges everything; one that lost packets before it
  // NAKs the first of them, and go-back-N resends from there. A slow peer
  // costs one packet, not the window.
  void probe_newest(uint64_t now_ns, PacketSink& out);

  RequesterConfig config_;
  std::deque<Outstanding> outstanding_;
  std::deque<RequesterCompletion> completions_;
  uint32_t next_psn_;   // the first PSN of the next message posted
  uint32_t send_psn_;   // the next PSN to transmit (<= next_psn_)
  uint32_t una_psn_;    // the oldest PSN not yet acknowledged
  uint32_t sent_end_;   // the PSN after the furthest one ever sent: responses name PSNs before it
  uint32_t packets_in_flight_ = 0;
  uint64_t deadline_ = 0;  // the ACK (or RNR) timer
  // The tail-loss probe: a path silent for a while after the last packet
  // sent is asked again, well before the ACK timer (0: none due). Once per
  // progress: what the probe or the ACK timer sends does not arm it again.
  uint64_t probe_at_ = 0;
  bool probe_spent_ = false;
  void arm_probe(uint64_t now_ns);
  // Every packet sent (re)arms the probe.
  void transmitted(uint64_t now_ns);
  // The PSN of the latest sequence NAK since the last progress.
  bool nak_since_progress_ = false;
  uint32_t last_nak_psn_ = 0;
  bool rnr_waiting_ = false;
  uint32_t rnr_psn_ = 0;
  uint8_t retry_left_;
  uint8_t rnr_left_;
  bool failed_ = false;
  uint32_t window_ = 128;               // packets that may be unacknowledged now
  uint32_t acked_toward_growth_ = 0;    // packets acknowledged since the window last grew
  // The round trip timed now: a first transmission that asks for an ACK,
  // the time it left and how many packets were acknowledged by then. A
  // go-back-N over it drops it (an ACK could then answer either copy).
  bool timing_ = false;
  uint32_t timed_psn_ = 0;
  uint64_t timed_sent_ns_ = 0;
  uint64_t timed_acked_before_ = 0;
  uint64_t acked_total_ = 0;            // packets acknowledged since the start
  uint64_t min_rtt_ns_ = 0;             // 0: none timed yet
  uint64_t srtt_ns_ = 0;                // the smoothed round trip (0: none timed yet)
  uint64_t rttvar_ns_ = 0;              // and its mean deviation
  // The delivery rates of the latest round trips timed, in packets per
  // millisecond: the fastest of them is the path's.
  static constexpr size_t kRateSamples = 8;
  uint32_t rates_[kRateSamples] = {};
  size_t rate_next_ = 0;
  // The responder keeps packets past a gap and reports holes (selective.hpp).
  bool peer_selective_ = false;
  // An answer came without the mark: the responder does not (a RoCE NIC,
  // rxe): requests go out with the reserved bits at zero from then on.
  bool peer_plain_ = false;
  bool probing_ = false;  // the tail probe is sending: its packet is marked kTailProbe
  uint32_t probe_rounds_ = 0;  // probes since progress (selective: each re-armed, later)
  uint32_t last_ack_req_psn_ = 0;  // the latest packet sent that asked for an ACK
};

}  // namespace softhca::transport
