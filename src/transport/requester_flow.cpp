#include "transport/requester_flow.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "common/iovec.hpp"
#include "transport/answer_counters.hpp"
#include "transport/completer.hpp"
#include "transport/ibta_timers.hpp"
#include "transport/psn.hpp"
#include "transport/retry_policy.hpp"
#include "transport/selective.hpp"

namespace softhca::transport {
namespace {

// How much may be unacknowledged at once: enough to keep a link busy for an
// RTT, little enough that a burst fits the receiver's socket buffer and that
// go-back-N after a loss resends a bounded amount.
constexpr size_t kWindowMessages = 128;
constexpr uint32_t kWindowPackets = 128;
// After a loss the window shrinks and grows back by a packet per window
// acknowledged: go-back-N resends what was in flight behind the lost packet,
// so in-flight packets beyond what the path holds (queued in a socket
// buffer, not moving faster) are resent for nothing. A PSN gap shrinks it
// to what the path holds (and the ACK step below), no further: halving it on each one made
// 1% random loss hold it near 20 packets (a packet per window of growth
// against a halving per hundred packets, Reno's 1.2/sqrt(loss)), far below
// what a fast path holds, and a quarter of the lossless bandwidth was left
// (a deterministic simulation, tests/unit/lossy_path_test.cpp). The same
// PSN NAKed again without progress halves it, as before: the resend was
// lost too, which a queue that overflows does (many processes handing
// packets to each other), random loss seldom. A timeout shrinks it to the
// least. This is not congestion control (no ECN, no
// pacing); it bounds the cost of a loss.
constexpr uint32_t kLeastWindowPackets = 16;
// A long message asks for an ACK every this many packets: the window frees
// in steps of it, so it needs that much beyond what the path holds.
constexpr uint32_t kAckEveryPackets = 32;
// How soon an ACK past a READ or atomic still unanswered may ask for it
// again: a few round trips on a busy host, far below any ACK timeout.
constexpr uint64_t kAskAgainAfterNs = 100'000;
// When a requester hears nothing for this long after the last packet it
// sent, it probes: one packet again, asking for an ACK, without spending a
// retry. The last packets of a burst that are lost leave the responder no
// later packet to see the gap by, and waiting out the ACK timer (67 ms at
// perftest's timeout 14) for each such loss made 1% loss cost most of the
// throughput. At most a quarter of the ACK timeout. A probe that resent the
// whole window instead made a peer that was merely slow (a host short of
// cores, rxe in a slow guest) receive much of it twice (issue #42).
constexpr uint64_t kTailProbeNs = 1'000'000;
// Once a round trip was timed, sooner: four of the least round trip, no
// sooner than 200 us (a descheduled thread answers late without anything
// being lost).
constexpr uint64_t kProbeRoundTrips = 4;
constexpr uint64_t kProbeFloorNs = 200'000;
// Towards a responder that keeps packets past a gap, probes go on, each
// twice as late, this many times.
constexpr uint32_t kSelectiveProbeDoublings = 6;

bool has_imm(Operation op) { return op == Operation::kSendWithImm || op == Operation::kWriteWithImm; }

}  // namespace

uint8_t request_opcode(bool unreliable, bool send, bool with_imm, wire::Segment segment) {
  uint8_t code = 0;
  switch (segment) {
    case wire::Segment::kFirst:
      code = send ? 0x00 : 0x06;
      break;
    case wire::Segment::kMiddle:
      code = send ? 0x01 : 0x07;
      break;
    case wire::Segment::kLast:
      code = send ? (with_imm ? 0x03 : 0x02) : (with_imm ? 0x09 : 0x08);
      break;
    case wire::Segment::kOnly:
      code = send ? (with_imm ? 0x05 : 0x04) : (with_imm ? 0x0B : 0x0A);
      break;
  }
  return static_cast<uint8_t>(code | (unreliable ? 0x20 : 0x00));
}

uint32_t RequesterFlow::Outstanding::last_psn() const { return psn_add(first_psn, npsn - 1); }

RequesterFlow::RequesterFlow(const RequesterConfig& config)
    : config_(config),
      next_psn_(config.start_psn & kPsnMask),
      send_psn_(config.start_psn & kPsnMask),
      una_psn_(config.start_psn & kPsnMask),
      sent_end_(config.start_psn & kPsnMask),
      retry_left_(config.retry_cnt),
      rnr_left_(config.rnr_retry) {
  if (!config_.reliable || config_.xrc) config_.selective = false;
}

uint32_t RequesterFlow::max_window() const { return peer_selective_ ? kKeepPackets : kWindowPackets; }

bool RequesterFlow::has_room() const {
  return !failed_ && outstanding_.size() < kWindowMessages && packets_in_flight_ < max_window();
}

bool RequesterFlow::is_read_or_atomic(const Outstanding& o) const {
  return o.message.op == Operation::kRead || o.message.op == Operation::kCompareSwap ||
         o.message.op == Operation::kFetchAdd;
}

void RequesterFlow::post(const OutgoingMessage& message, uint64_t now_ns, PacketSink& out) {
  Outstanding o;
  o.message = message;
  o.first_psn = next_psn_;
  // A READ takes a PSN per response packet; an atomic one.
  o.npsn = is_atomic(message.op) ? 1 : packets_for(message.length, config_.mtu);
  o.read_next = o.first_psn;
  o.read_asked = o.first_psn;
  next_psn_ = psn_add(next_psn_, o.npsn);
  if (!config_.reliable) {
    // UC: no acknowledgements and no window; the message is done once it is sent.
    for (uint32_t i = 0; i < o.npsn; ++i) transmit_packet(o, i, now_ns, out);
    send_psn_ = una_psn_ = next_psn_;
    completions_.push_back(RequesterCompletion{message.position, IBV_WC_SUCCESS});
    return;
  }
  packets_in_flight_ += o.npsn;
  outstanding_.push_back(o);
  pump(now_ns, out);
  if (deadline_ == 0) {
    arm_ack_timer(now_ns);
    arm_probe(now_ns);
  }
}

void RequesterFlow::pump(uint64_t now_ns, PacketSink& out) {
  if (rnr_waiting_ || failed_) return;
  // READs and atomics already sent and not yet answered.
  uint32_t rd_atomic_in_flight = 0;
  const uint32_t rd_atomic_limit = std::max<uint32_t>(1, config_.max_rd_atomic);
  for (Outstanding& o : outstanding_) {
    if (psn_diff(send_psn_, next_psn_) >= 0) return;
    if (psn_diff(o.last_psn(), send_psn_) < 0) {  // all of it sent
      if (is_read_or_atomic(o)) ++rd_atomic_in_flight;
      continue;
    }
    if (psn_diff(send_psn_, una_psn_) >= static_cast<int32_t>(window_)) return;
    // After a loss (a window below its most), a READ goes out only once all
    // its response packets fit in the window, or alone: a READ's responses
    // lost make every READ in flight behind them be answered again, and at
    // 5% loss ib_read_bw -s 65536 (16 READs of 64 packets in flight) had
    // 37 times the packets it needed sent (11 MB/s).
    if (o.message.op == Operation::kRead && window_ < max_window() && psn_diff(send_psn_, una_psn_) > 0 &&
        psn_diff(psn_add(o.first_psn, o.npsn), una_psn_) > static_cast<int32_t>(window_))
      return;
    // No more READs and atomics in flight than the responder keeps to
    // answer again: one it forgot could never be answered on a retry.
    if (is_read_or_atomic(o) && rd_atomic_in_flight >= rd_atomic_limit) return;
    if (is_read_or_atomic(o) || o.message.op == Operation::kAtomicWrite) {
      if (o.message.op == Operation::kRead && psn_diff(send_psn_, o.first_psn) > 0) o.read_next = send_psn_;
      transmit_packet(o, 0, now_ns, out);
      send_psn_ = psn_add(o.first_psn, o.npsn);
      sent_through(send_psn_);
      // It is in flight now too: one pass must not send past the limit (a
      // completion, or a go-back-N that rewound over several, let every
      // READ left go out at once, and the responder forgot the oldest).
      if (is_read_or_atomic(o)) ++rd_atomic_in_flight;
      continue;
    }
    for (uint32_t i = static_cast<uint32_t>(psn_diff(send_psn_, o.first_psn)); i < o.npsn; ++i) {
      if (psn_diff(send_psn_, una_psn_) >= static_cast<int32_t>(window_)) return;
      transmit_packet(o, i, now_ns, out);
      send_psn_ = psn_add(o.first_psn, i + 1);
      sent_through(send_psn_);
    }
  }
}

bool RequesterFlow::starts_and_ends_right(const Outstanding& read, uint32_t psn, wire::Segment segment) {
  // A READ's response begins with a FIRST packet (ONLY when it is one
  // packet long) and ends with a LAST (or an ONLY, the answer to asking
  // again for the last packet alone), as rxe's completer checks; inside it
  // any segment may come, since a READ asked again is answered from the
  // PSN asked for with a response of its own. A MIDDLE or LAST at the first
  // PSN is no start of this READ's response: taken for one, its bytes
  // landed, and a one-packet READ completed on it.
  // An ONLY at the first PSN of a longer READ answers a probe for it (a
  // softhca responder's answer to a marked probe).
  if (psn == read.first_psn) {
    if (read.npsn == 1) return segment == wire::Segment::kOnly;
    return segment == wire::Segment::kFirst || (read.asked_one && segment == wire::Segment::kOnly);
  }
  if (psn == read.last_psn()) return segment == wire::Segment::kLast || segment == wire::Segment::kOnly;
  return true;
}

void RequesterFlow::advance_una(uint32_t psn_after) {
  if (psn_diff(psn_after, una_psn_) > 0) {
    // A packet per window acknowledged, back up to the full window.
    acked_toward_growth_ += static_cast<uint32_t>(psn_diff(psn_after, una_psn_));
    acked_total_ += static_cast<uint32_t>(psn_diff(psn_after, una_psn_));
    while (window_ < max_window() && acked_toward_growth_ >= window_) {
      acked_toward_growth_ -= window_;
      ++window_;
    }
    una_psn_ = psn_after;
  }
  if (psn_diff(una_psn_, send_psn_) > 0) send_psn_ = una_psn_;
}

void RequesterFlow::sent_through(uint32_t psn_after) {
  if (psn_diff(psn_after, sent_end_) > 0) sent_end_ = psn_after;
}

void RequesterFlow::send_packet(wire::Headers& h, const OutgoingMessage& m, PacketSink& out, const iovec* payload,
                                int npayload, uint32_t length) const {
  if (config_.xrc) {
    h.bth.opcode = wire::xrc_twin(h.bth.opcode);
    h.xrceth = wire::Xrceth{m.xrc_srqn & wire::kMax24};
  }
  // Every packet of a PSN sent before is counted as sent again, whatever
  // sends it (go-back-N, a hole's resend, a probe, a READ asked again):
  // counted by the PSNs a go-back-N rewound over instead, a READ asked again
  // counted each response packet it covered, not the one request.
  if (config_.reliable && psn_diff(h.bth.psn, sent_end_) < 0) config_.counters.add(Counter::kRetransmittedPkts);
  if (config_.selective && !peer_plain_) {
    h.bth.reserved7 = kSelective;
    if (psn_diff(h.bth.psn, sent_end_) < 0) h.bth.reserved7 |= kResent;
    if (probing_) h.bth.reserved7 |= kTailProbe;
  }
  out.send(h, payload, npayload, length);
}

void RequesterFlow::transmit_packet(Outstanding& o, uint32_t index, uint64_t now_ns, PacketSink& out) {
  transmitted(now_ns);
  const OutgoingMessage& m = o.message;
  wire::Headers h;
  h.bth.dest_qpn = config_.dest_qpn;
  const bool unreliable = !config_.reliable;
  switch (m.op) {
    case Operation::kRead: {
      // One request for what is still missing of the READ: the whole of it
      // at first, the rest from the first response packet that did not
      // come when it is asked again (IBTA 9.4.4: the responder answers a
      // READ whose PSN falls inside an earlier one from that PSN on).
      // Asked again, it asks for a window's worth at a time, so that a lossy
      // path does not answer the whole rest once per lost packet.
      //
      // The tail probe asks for one packet: a READ stalled at a busy
      // responder (its host short of cores), asked again for the rest, was
      // answered twice (an 8 MiB READ: 8,192 packets for a probe). Its
      // answer is a READ response ONLY, which tells it apart. Only once a
      // response came: a responder that never had the READ would take a
      // one-packet request from its first PSN for a new READ of one packet,
      // and refuse every longer one from there as reaching past it. Before
      // that the probe asks for the whole READ; a softhca responder answers
      // that probe (marked) with the first packet alone when it has the READ.
      const uint32_t done = static_cast<uint32_t>(psn_diff(o.read_next, o.first_psn));
      const uint64_t offset = uint64_t{done} * config_.mtu;
      const bool one = probing_ && done != 0;
      const uint32_t packets = one ? 1 : done == 0 ? o.npsn : std::min(o.npsn - done, window_);
      if (probing_ && done == 0 && config_.selective && !peer_plain_) o.asked_one = true;
      const uint64_t length = std::min<uint64_t>(m.length - offset, uint64_t{packets} * config_.mtu);
      h.bth.opcode = static_cast<uint8_t>(wire::Opcode::kRcRdmaReadRequest);
      h.bth.psn = o.read_next;
      h.bth.ack_req = true;
      h.reth = wire::Reth{m.remote_addr + offset, m.rkey, static_cast<uint32_t>(length)};
      if (!probing_) {  // the probe is an extra: the request it stands beside still counts
        time_round_trip(o.read_next, now_ns);  // to its first response
        o.read_asked = o.read_next;
        o.read_asked_end = psn_add(o.read_next, packets);
        o.responses_since_ask = 0;
      }
      send_packet(h, m, out, nullptr, 0, 0);
      return;
    }
    case Operation::kCompareSwap:
    case Operation::kFetchAdd: {
      h.bth.opcode = static_cast<uint8_t>(m.op == Operation::kFetchAdd ? wire::Opcode::kRcFetchAdd
                                                                        : wire::Opcode::kRcCompareSwap);
      h.bth.psn = o.first_psn;
      h.bth.ack_req = true;
      h.atomic_eth = wire::AtomicEth{m.remote_addr, m.rkey, m.op == Operation::kFetchAdd ? m.compare_add : m.swap,
                                     m.op == Operation::kFetchAdd ? 0 : m.compare_add};
      time_round_trip(o.first_psn, now_ns);
      send_packet(h, m, out, nullptr, 0, 0);
      return;
    }
    case Operation::kAtomicWrite: {
      h.bth.opcode = static_cast<uint8_t>(wire::Opcode::kRcAtomicWrite);
      h.bth.psn = o.first_psn;
      h.bth.ack_req = true;
      h.reth = wire::Reth{m.remote_addr, m.rkey, 8};
      send_packet(h, m, out, m.local, m.nlocal, 8);
      return;
    }
    default:
      break;
  }
  // SEND and WRITE: one packet per MTU.
  const bool send = is_send(m.op);
  const uint32_t i = index;
  const wire::Segment segment = segment_of(i, o.npsn);
  const bool last = segment == wire::Segment::kLast || segment == wire::Segment::kOnly;
  h.bth.opcode = request_opcode(unreliable, send, last && has_imm(m.op), segment);
  if (last && m.op == Operation::kSendWithInv) {
    // RC only (the QP refused it otherwise): the IETH names the rkey.
    h.bth.opcode = static_cast<uint8_t>(segment == wire::Segment::kOnly ? wire::Opcode::kRcSendOnlyWithInvalidate
                                                                         : wire::Opcode::kRcSendLastWithInvalidate);
    h.ieth = wire::Ieth{m.invalidate_rkey};
  }
  h.bth.psn = psn_add(o.first_psn, i);
  h.bth.solicited = last && m.solicited;
  // Ask for an ACK at the end of each message, every 32 packets inside a
  // long one, and when the window fills, so that it moves on.
  bool fills_window = psn_diff(psn_add(h.bth.psn, 1), una_psn_) >= static_cast<int32_t>(window_);
  // Towards a responder that keeps packets past a gap the window stays full
  // while a hole waits for its resend; asking on every packet sent then
  // would draw an ACK per packet, each letting one more out (no batching).
  if (fills_window && peer_selective_ && psn_diff(h.bth.psn, last_ack_req_psn_) < 16) fills_window = false;
  h.bth.ack_req =
      config_.reliable && (last || (i % kAckEveryPackets) == kAckEveryPackets - 1 || fills_window || probing_);
  if (h.bth.ack_req) {
    last_ack_req_psn_ = h.bth.psn;
    time_round_trip(h.bth.psn, now_ns);
  }
  if (!send && (segment == wire::Segment::kFirst || segment == wire::Segment::kOnly))
    h.reth = wire::Reth{m.remote_addr, m.rkey, static_cast<uint32_t>(m.length)};
  if (last && has_imm(m.op)) h.immdt = wire::ImmDt{ntohl(m.imm_data)};
  const uint64_t offset = uint64_t{i} * config_.mtu;
  const uint64_t bytes = m.length - offset < config_.mtu ? m.length - offset : config_.mtu;
  iovec part[limits::kMaxSge + 1];
  const int n = slice_iovecs(m.local, m.nlocal, offset, bytes, part);
  send_packet(h, m, out, part, n, static_cast<uint32_t>(bytes));
}

void RequesterFlow::retransmit_from(uint32_t psn, uint64_t now_ns, PacketSink& out) {
  // An atomic is sent again whole; a READ from its first missing response.
  for (const Outstanding& o : outstanding_) {
    if (psn_diff(o.last_psn(), psn) < 0) continue;
    if (psn_diff(psn, o.first_psn) > 0 && (is_atomic(o.message.op) || o.message.op == Operation::kAtomicWrite))
      psn = o.first_psn;
    if (o.message.op == Operation::kRead && psn_diff(psn, o.read_next) != 0 && psn_diff(psn, o.first_psn) >= 0)
      psn = o.read_next;
    break;
  }
  // A timed packet sent again: its ACK no longer times one round trip.
  if (timing_ && psn_diff(timed_psn_, psn) >= 0) timing_ = false;
  send_psn_ = psn;
  if (psn_diff(una_psn_, psn) > 0) una_psn_ = psn;
  pump(now_ns, out);
}

uint32_t RequesterFlow::path_packets() const {
  const uint32_t rate = *std::max_element(std::begin(rates_), std::end(rates_));  // packets per ms
  return static_cast<uint32_t>(std::min<uint64_t>(kWindowPackets, uint64_t{rate} * min_rtt_ns_ / 1'000'000));
}

void RequesterFlow::time_round_trip(uint32_t psn, uint64_t now_ns) {
  // Only a first transmission: an ACK after a resend may answer either copy.
  if (timing_ || psn != sent_end_) return;
  timing_ = true;
  timed_psn_ = psn;
  timed_sent_ns_ = now_ns;
  timed_acked_before_ = acked_total_;
}

void RequesterFlow::round_trip_answered(uint64_t now_ns) {
  if (!timing_ || psn_diff(una_psn_, timed_psn_) <= 0) return;
  timing_ = false;
  const uint64_t rtt = now_ns > timed_sent_ns_ ? now_ns - timed_sent_ns_ : 1;
  if (min_rtt_ns_ == 0 || rtt < min_rtt_ns_) min_rtt_ns_ = rtt;
  // The smoothed round trip and its variation (RFC 6298's gains).
  if (srtt_ns_ == 0) {
    srtt_ns_ = rtt;
    rttvar_ns_ = rtt / 2;
  } else {
    const uint64_t error = rtt > srtt_ns_ ? rtt - srtt_ns_ : srtt_ns_ - rtt;
    rttvar_ns_ = (3 * rttvar_ns_ + error) / 4;
    srtt_ns_ = (7 * srtt_ns_ + rtt) / 8;
  }
  // What was acknowledged while it went there and back: the path's rate,
  // or less where the window or the application held it back.
  const uint64_t delivered = acked_total_ - timed_acked_before_;
  rates_[rate_next_] = static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, delivered * 1'000'000 / rtt));
  rate_next_ = (rate_next_ + 1) % kRateSamples;
}

void RequesterFlow::resend_range(uint32_t first, uint32_t count, uint64_t now_ns, PacketSink& out) {
  count = std::min(count, kKeepPackets);
  const uint32_t end = psn_add(first, count);
  // An ACK for a timed packet behind the hole comes once the hole fills.
  if (timing_ && psn_diff(timed_psn_, first) >= 0) timing_ = false;
  for (Outstanding& o : outstanding_) {
    if (psn_diff(o.first_psn, end) >= 0 || psn_diff(o.first_psn, send_psn_) >= 0) break;
    if (psn_diff(o.last_psn(), first) < 0 || psn_diff(o.last_psn(), una_psn_) < 0) continue;
    if (is_read_or_atomic(o) || o.message.op == Operation::kAtomicWrite) {
      transmit_packet(o, 0, now_ns, out);  // a READ asks from its first missing response
      continue;
    }
    // Only what went out in this pass: PSNs from send_psn_ on go out anyway.
    uint32_t from = first;
    if (psn_diff(from, o.first_psn) < 0) from = o.first_psn;
    if (psn_diff(from, una_psn_) < 0) from = una_psn_;
    for (uint32_t p = from; psn_diff(p, end) < 0 && psn_diff(p, o.last_psn()) <= 0 && psn_diff(p, send_psn_) < 0;
         p = psn_add(p, 1)) {
      transmit_packet(o, static_cast<uint32_t>(psn_diff(p, o.first_psn)), now_ns, out);
    }
  }
}

void RequesterFlow::probe_newest(uint64_t now_ns, PacketSink& out) {
  if (psn_diff(send_psn_, una_psn_) <= 0) return;  // nothing in flight
  const uint32_t psn = psn_add(send_psn_, kPsnMask);  // the newest packet sent
  for (Outstanding& o : outstanding_) {
    if (psn_diff(psn, o.first_psn) < 0) return;
    if (psn_diff(psn, o.last_psn()) > 0) continue;
    const bool one_request = is_read_or_atomic(o) || o.message.op == Operation::kAtomicWrite;
    transmit_packet(o, one_request ? 0 : static_cast<uint32_t>(psn_diff(psn, o.first_psn)), now_ns, out);
    return;
  }
}

void RequesterFlow::shrink_window(uint32_t packets) {
  window_ = std::max(kLeastWindowPackets, std::min(window_, packets));
  acked_toward_growth_ = 0;
}

void RequesterFlow::complete_front(ibv_wc_status status) {
  const Outstanding& o = outstanding_.front();
  completions_.push_back(RequesterCompletion{o.message.position, status});
  packets_in_flight_ -= o.npsn;
  outstanding_.pop_front();
}

void RequesterFlow::fail_front(ibv_wc_status status) {
  complete_front(status);
  failed_ = true;
  deadline_ = 0;
  probe_at_ = 0;
}

void RequesterFlow::transmitted(uint64_t now_ns) {
  // The probe counts from the last packet sent, not from the last progress:
  // a window slower than the probe's delay to be acknowledged is not lost
  // while packets still go out (counted from progress, the probe resent
  // such windows for nothing: 0.8% of a lossless ib_write_bw's packets).
  if (config_.reliable && !probe_spent_ && !rnr_waiting_ && !failed_) arm_probe(now_ns);
}

void RequesterFlow::arm_probe(uint64_t now_ns) {
  const uint64_t wait = ack_timeout_ns(config_.timeout);
  uint64_t delay = std::min(kTailProbeNs, wait / 4);
  // A probe costs one packet, not a window: once a round trip was timed it
  // comes a few round trips after the last packet sent (a lost resend of a
  // burst's last hole, or a lost NAK, waits for it), but no sooner than the
  // round trips seen lately vary: a peer that answers late now and then
  // (rxe in an emulated guest, a host short of cores) is not probed at each.
  if (min_rtt_ns_ != 0)
    delay = std::min(wait / 4, std::max({kProbeFloorNs, kProbeRoundTrips * min_rtt_ns_,
                                         2 * srtt_ns_ + 4 * rttvar_ns_}));
  // And probes again, each time twice as late, until progress: a probe whose
  // packet, reports or resends were lost would otherwise leave the hole to
  // the ACK timer (a tenth of a second at 20% loss, for each).
  if (peer_selective_) delay <<= std::min<uint32_t>(probe_rounds_, kSelectiveProbeDoublings);
  probe_at_ = (wait == 0 || delay == 0) ? 0 : now_ns + delay;
}

void RequesterFlow::arm_ack_timer(uint64_t now_ns) {
  const uint64_t wait = ack_timeout_ns(config_.timeout);
  deadline_ = now_ns + (wait != 0 ? wait : kInfiniteTimeoutPollNs);
}

void RequesterFlow::progress_made(uint64_t now_ns) {
  // Forward progress restores the retry budget (it counts consecutive
  // timeouts of one packet, not the connection's lifetime).
  retry_left_ = config_.retry_cnt;
  rnr_left_ = config_.rnr_retry;
  rnr_waiting_ = false;
  probe_spent_ = false;
  probe_rounds_ = 0;
  nak_since_progress_ = false;
  if (outstanding_.empty()) {
    deadline_ = 0;
    probe_at_ = 0;
  } else {
    arm_ack_timer(now_ns);
    arm_probe(now_ns);
  }
}

void RequesterFlow::acknowledge_through(uint32_t psn, uint64_t now_ns, PacketSink& out) {
  const uint32_t una_before = una_psn_;
  bool completed = false;
  // Packets up to psn arrived, even mid-message: the window moves. Up to
  // any PSN sent, not only below the next to send: an RNR NAK or a
  // go-back-N rewinds that, and the window left behind messages an ACK
  // completed made the next one posted be skipped.
  if (!outstanding_.empty() && psn_diff(psn, una_psn_) >= 0 && psn_diff(psn, sent_end_) < 0) {
    advance_una(psn_add(psn, 1));
    round_trip_answered(now_ns);
  }
  while (!outstanding_.empty() && psn_diff(outstanding_.front().last_psn(), psn) <= 0) {
    Outstanding& front = outstanding_.front();
    if (is_read_or_atomic(front)) {
      // Acknowledged past a READ or atomic whose response never came: it was
      // lost; ask again (the responder replays it). Every duplicate the
      // go-back-N resends is ACKed past it again: asking again on each ACK
      // made a storm, so at most once per kAskAgainAfterNs (on a lossy path
      // the response to the asking again is lost too, and waiting for the
      // ACK timer each time made a run of atomics crawl), and no sooner than
      // the asking could have been answered: the responses of the READs
      // behind a READ whose responses were lost (each a sign of that loss)
      // made ib_read_bw at 1% loss ask for the whole window again about
      // every 100 us while they came, and a third of what it received was
      // answered twice.
      const uint64_t answer_ns = std::max(kAskAgainAfterNs, srtt_ns_ + 4 * rttvar_ns_);
      if (front.asked_again_ns == 0 || now_ns >= front.asked_again_ns + answer_ns) {
        front.asked_again_ns = now_ns == 0 ? 1 : now_ns;
        retransmit_from(front.first_psn, now_ns, out);
      }
      break;
    }
    complete_front(IBV_WC_SUCCESS);
    completed = true;
  }
  // Only its response answers a READ or atomic: however far an ACK goes,
  // inside or past it, the window stays at the first one still waiting
  // (else a responder that ACKs without answering moved it on, and the
  // timer asked again from there, never for the READ).
  if (!outstanding_.empty() && is_read_or_atomic(outstanding_.front())) {
    const Outstanding& front = outstanding_.front();
    const uint32_t resume = front.message.op == Operation::kRead ? front.read_next : front.first_psn;
    if (psn_diff(una_psn_, resume) > 0) una_psn_ = resume;
  }
  // Progress is a completion or a window that moved on in the end: an ACK
  // that only passed a READ or atomic still waiting does not restore the
  // retries, or a responder that cannot answer it would keep them full.
  if (completed || psn_diff(una_psn_, una_before) > 0) progress_made(now_ns);
  pump(now_ns, out);
}

void RequesterFlow::on_response(const wire::ParsedPacket& packet, uint64_t now_ns, PacketSink& out) {
  // Every response that changes nothing is counted (stale_responses), so
  // that a peer whose answers all go unheard shows in `softhca stat`.
  if (failed_ || outstanding_.empty()) {
    config_.counters.add(Counter::kStaleResponses);
    return;
  }
  const wire::Headers& h = packet.headers;
  const uint32_t psn = h.bth.psn;
  // A response names a PSN already sent. One at or past the furthest ever
  // sent (stale, or from nobody's responder) is dropped: an ACK of it
  // completed every message up to it, those the window had not sent yet too.
  if (psn_diff(psn, sent_end_) >= 0) {
    config_.counters.add(Counter::kStaleResponses);
    return;
  }
  if (config_.selective && !peer_selective_ && !peer_plain_) {
    if ((h.bth.reserved7 & kSelective) != 0) {
      peer_selective_ = true;  // the responder keeps packets past a gap: a window of what it keeps
      window_ = kKeepPackets;
    } else if (packet.info.operation != wire::Operation::kAcknowledge || !h.aeth || h.aeth->syndrome.is_ack()) {
      // It answered a marked request without the mark. A NAK does not
      // tell: a softhca responder turns selective only at the request of
      // the PSN it expects, so when the connection's first packet is lost
      // it reports the gap unmarked (at 20% loss one connection in five
      // fell back to go-back-N for its life that way, and crawled).
      peer_plain_ = true;
    }
  }
  switch (packet.info.operation) {
    case wire::Operation::kAcknowledge: {
      if (!h.aeth) return;
      const wire::Syndrome s = h.aeth->syndrome;
      if (peer_selective_ && (h.bth.reserved7 & kHoleReport) != 0) {
        // A hole the responder keeps packets behind: those PSNs again, and
        // nothing else (it acknowledges nothing; the window stays).
        if (s.nak_code() != wire::NakCode::kPsnSequenceError || rnr_waiting_) return;
        count_received_answer(config_.counters, Answer::kNakSequenceError);
        resend_range(psn, h.aeth->msn, now_ns, out);
        return;
      }
      if (s.is_ack()) {
        if (psn_diff(psn, una_psn_) < 0) config_.counters.add(Counter::kStaleResponses);  // acknowledges nothing new
        acknowledge_through(psn, now_ns, out);
        return;
      }
      // A NAK acknowledges everything before the PSN it names.
      acknowledge_through(psn_add(psn, kPsnMask), now_ns, out);  // psn - 1
      if (outstanding_.empty() || psn_diff(psn, outstanding_.front().first_psn) < 0) {
        config_.counters.add(Counter::kStaleResponses);
        return;
      }
      if (s.is_rnr_nak()) {
        count_received_answer(config_.counters, Answer::kRnrNak);
        if (after_rnr_nak(config_.rnr_retry, rnr_left_) == RetryVerdict::kGiveUp) {
          fail_front(IBV_WC_RNR_RETRY_EXC_ERR);
          return;
        }
        rnr_waiting_ = true;
        rnr_psn_ = psn;
        send_psn_ = psn;
        deadline_ = now_ns + rnr_timer_ns(s.value());
        probe_at_ = 0;
        return;
      }
      const std::optional<wire::NakCode> code = s.nak_code();
      if (!code) return;
      switch (*code) {
        case wire::NakCode::kPsnSequenceError: {
          count_received_answer(config_.counters, Answer::kNakSequenceError);
          // A resend costs a retry, as an ACK timeout's does (rxe's
          // completer too): two ends that disagree about the PSNs, or a
          // forged NAK, would otherwise trade NAKs and resends for ever. A
          // NAK that acknowledged something above restored the budget first;
          // one past the previous NAK's PSN shows the responder moved on
          // (when an atomic's lost ACK holds the window, the NAKs after it
          // acknowledge nothing) and costs nothing.
          const bool moved_on = nak_since_progress_ && psn_diff(psn, last_nak_psn_) > 0;
          // The same PSN NAKed again before any progress: the resend was lost
          // too, as a full queue on the way loses a burst, not as a random loss.
          const bool lost_again = nak_since_progress_ && !moved_on;
          nak_since_progress_ = true;
          last_nak_psn_ = psn;
          if (!moved_on && after_ack_timeout(retry_left_) == RetryVerdict::kGiveUp) {
            fail_front(IBV_WC_RETRY_EXC_ERR);
            return;
          }
          // A first loss cuts the window to what the path holds; a loss
          // again, or one before any round trip was timed, halves it.
          const uint32_t held = lost_again ? 0 : path_packets();
          shrink_window(held != 0 ? held + kAckEveryPackets : window_ / 2);
          retransmit_from(psn, now_ns, out);
          arm_ack_timer(now_ns);
          return;
        }
        case wire::NakCode::kInvalidRequest:
        case wire::NakCode::kInvalidRdRequest:
          count_received_answer(config_.counters, Answer::kNakInvalidRequest);
          fail_front(status_of_nak(Answer::kNakInvalidRequest));
          return;
        case wire::NakCode::kRemoteAccessError:
          count_received_answer(config_.counters, Answer::kNakRemoteAccess);
          fail_front(status_of_nak(Answer::kNakRemoteAccess));
          return;
        case wire::NakCode::kRemoteOperationalError:
          count_received_answer(config_.counters, Answer::kNakRemoteOperational);
          fail_front(status_of_nak(Answer::kNakRemoteOperational));
          return;
      }
      return;
    }
    case wire::Operation::kAtomicAcknowledge: {
      if (!h.atomic_ack_eth) return;
      acknowledge_through(psn_add(psn, kPsnMask), now_ns, out);
      if (outstanding_.empty()) return;
      Outstanding& front = outstanding_.front();
      if (front.first_psn != psn || !is_atomic(front.message.op)) return;
      const uint64_t original = h.atomic_ack_eth->original;
      iovec value{const_cast<uint64_t*>(&original), sizeof original};
      copy_iovecs(front.message.local, front.message.nlocal, &value, 1, sizeof original);
      advance_una(psn_add(psn, 1));
      round_trip_answered(now_ns);
      complete_front(IBV_WC_SUCCESS);
      progress_made(now_ns);
      pump(now_ns, out);
      return;
    }
    case wire::Operation::kRdmaReadResponse: {
      // A response to a READ implies every earlier request was received.
      Outstanding* read = nullptr;
      for (Outstanding& o : outstanding_) {
        if (o.message.op == Operation::kRead && psn_diff(psn, o.first_psn) >= 0 && psn_diff(psn, o.last_psn()) <= 0) {
          read = &o;
          break;
        }
      }
      if (read == nullptr) {
        config_.counters.add(Counter::kStaleResponses);
        return;
      }
      if (!starts_and_ends_right(*read, psn, packet.info.segment)) {
        config_.counters.add(Counter::kMalformedDrops);
        return;
      }
      // The answer to a request for one packet (the probe's) that the READ's
      // own responses already brought: nothing to do.
      const bool one_packet_answer = packet.info.segment == wire::Segment::kOnly && read->npsn > 1;
      if (one_packet_answer && psn_diff(psn, read->read_next) < 0) {
        config_.counters.add(Counter::kStaleResponses);
        return;
      }
      ++read->responses_since_ask;
      if (psn != read->read_next) {
        // A response packet went missing: ask for the rest from it, once per
        // round of responses. A new round shows as PSNs that go back (the
        // first packet of the one we asked for was lost too), but only once
        // half as many responses came as the latest request asked for:
        // duplicated and reordered responses go back too, and asking again
        // on each of them answered the same READ over and over.
        const auto asked = static_cast<uint32_t>(psn_diff(read->read_asked_end, read->read_asked));
        const bool new_round =
            psn_diff(psn, read->read_seen) <= 0 && read->responses_since_ask >= std::max<uint32_t>(1, asked / 2);
        read->read_seen = psn;
        if (psn_diff(psn, read->read_next) > 0 && (read->read_asked != read->read_next || new_round)) {
          // A loss: fewer READ responses in flight from now on (pump), as a
          // sequence NAK makes fewer requests (each READ behind the lost
          // packet is answered again whole).
          shrink_window(window_ / 2);
          transmit_packet(*read, 0, now_ns, out);
        }
        return;
      }
      read->read_seen = psn;
      const uint32_t first = read->first_psn;
      acknowledge_through(psn_add(first, kPsnMask), now_ns, out);
      Outstanding& front = outstanding_.front();
      if (front.first_psn != first) return;
      // Every packet but the last carries a full MTU: a short one would
      // leave a hole in the buffer that the READ then completed with.
      const uint64_t offset = uint64_t{static_cast<uint32_t>(psn_diff(psn, first))} * config_.mtu;
      const uint64_t expected_bytes = psn == front.last_psn() ? front.message.length - offset : config_.mtu;
      if (packet.payload.size() != expected_bytes) {
        config_.counters.add(Counter::kMalformedDrops);
        return;
      }
      iovec into[limits::kMaxSge + 1];
      const int n = slice_iovecs(front.message.local, front.message.nlocal, offset, packet.payload.size(), into);
      iovec from{const_cast<uint8_t*>(packet.payload.data()), packet.payload.size()};
      copy_iovecs(into, n, &from, 1, packet.payload.size());
      front.read_next = psn_add(psn, 1);
      front.asked_again_ns = 0;  // it answers: a later loss may be inferred from an ACK again
      advance_una(psn_add(psn, 1));
      round_trip_answered(now_ns);
      if (psn == front.last_psn()) {
        complete_front(IBV_WC_SUCCESS);
      } else if (front.read_next == front.read_asked_end || one_packet_answer) {
        // The next window's worth; or the rest, when the probe's answer came
        // before the READ's own responses: a responder answers in order, so
        // it never had the first request (lost), or its responses were lost.
        transmit_packet(front, 0, now_ns, out);
      }
      progress_made(now_ns);
      pump(now_ns, out);
      return;
    }
    default:
      return;
  }
}

void RequesterFlow::on_timer(uint64_t now_ns, PacketSink& out) {
  if (probe_at_ != 0 && now_ns >= probe_at_ && (deadline_ == 0 || now_ns < deadline_)) {
    // Each probe is one packet that asks for an ACK; it costs no retry.
    // Go-back-N: the newest packet, then once more the oldest (what it
    // sends arms the next; after that only progress does). Selective:
    // re-armed by its own packet, twice as late each time, seven times at
    // most; then the ACK timer's (a responder in ERROR answers nothing).
    probe_at_ = 0;
    const uint32_t round = probe_rounds_;
    if (probe_rounds_ < (peer_selective_ ? kSelectiveProbeDoublings : 1)) {
      ++probe_rounds_;
    } else {
      probe_spent_ = true;
    }
    if (failed_ || rnr_waiting_ || outstanding_.empty()) return;
    probing_ = true;
    if (peer_selective_ || round != 0) {
      // A responder that keeps packets past a gap has what came after the
      // oldest unacknowledged one: that one alone, marked as the probe,
      // which it answers with every hole it still has. A go-back-N one
      // whose NAK for a gap was lost answers nothing past the gap (it NAKs
      // a gap once): the oldest packet is the one it waits for, and taking
      // it lets it NAK the next gap again.
      resend_range(una_psn_, 1, now_ns, out);
    } else {
      probe_newest(now_ns, out);
    }
    probing_ = false;
    return;
  }
  if (failed_ || deadline_ == 0 || now_ns < deadline_) return;
  probe_at_ = 0;
  if (outstanding_.empty()) {
    deadline_ = 0;
    return;
  }
  if (rnr_waiting_) {
    rnr_waiting_ = false;
    retransmit_from(rnr_psn_, now_ns, out);
    arm_ack_timer(now_ns);
    return;
  }
  if (ack_timeout_ns(config_.timeout) != 0 && after_ack_timeout(retry_left_) == RetryVerdict::kGiveUp) {
    fail_front(IBV_WC_RETRY_EXC_ERR);
    return;
  }
  config_.counters.add(Counter::kCompleterRetryErr);
  shrink_window(kLeastWindowPackets);
  probe_spent_ = true;  // no probe after a timeout until progress: the timer paces the retries
  retransmit_from(una_psn_, now_ns, out);
  arm_ack_timer(now_ns);
}

bool RequesterFlow::pop_completion(RequesterCompletion& out) {
  if (completions_.empty()) return false;
  out = completions_.front();
  completions_.pop_front();
  return true;
}

void RequesterFlow::abort() {
  probe_at_ = 0;
  outstanding_.clear();
  send_psn_ = una_psn_ = sent_end_ = next_psn_;
  packets_in_flight_ = 0;
  deadline_ = 0;
  failed_ = true;
}

}  // namespace softhca::transport
