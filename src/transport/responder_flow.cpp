#include "transport/responder_flow.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/iovec.hpp"
#include "transport/answer_counters.hpp"
#include "transport/psn.hpp"

namespace softhca::transport {
namespace {

bool is_last(wire::Segment s) { return s == wire::Segment::kLast || s == wire::Segment::kOnly; }
bool is_first(wire::Segment s) { return s == wire::Segment::kFirst || s == wire::Segment::kOnly; }

// The transport an opcode belongs to, as an ibv_qp_type (0, no type, for RD).
uint32_t qp_type_of(wire::Transport t) {
  switch (t) {
    case wire::Transport::kRc:
      return IBV_QPT_RC;
    case wire::Transport::kUc:
      return IBV_QPT_UC;
    case wire::Transport::kUd:
      return IBV_QPT_UD;
    case wire::Transport::kXrc:
      return IBV_QPT_XRC_SEND;  // the requester's side of XRC
    case wire::Transport::kRd:
      break;
  }
  return 0;
}

wire::Syndrome to_wire(const Syndrome& s) {
  switch (s.answer) {
    case Answer::kAck:
      return wire::Syndrome::ack(wire::Syndrome::kNoCredits);
    case Answer::kRnrNak:
      return wire::Syndrome::rnr_nak(s.rnr_timer);
    case Answer::kNakSequenceError:
      return wire::Syndrome::nak(wire::NakCode::kPsnSequenceError);
    case Answer::kNakInvalidRequest:
      return wire::Syndrome::nak(wire::NakCode::kInvalidRequest);
    case Answer::kNakRemoteAccess:
      return wire::Syndrome::nak(wire::NakCode::kRemoteAccessError);
    case Answer::kNakRemoteOperational:
    case Answer::kSilence:
      break;
  }
  return wire::Syndrome::nak(wire::NakCode::kRemoteOperationalError);
}

}  // namespace

ResponderFlow::ResponderFlow(const ResponderConfig& config)
    : config_(config), epsn_(config.start_psn & kPsnMask), seen_end_(epsn_) {
  if (config_.resources == 0) config_.resources = 1;
  if (!config_.reliable || config_.xrc) config_.selective = false;
}

Request ResponderFlow::request_of(const wire::ParsedPacket& packet, Operation op) const {
  const wire::Headers& h = packet.headers;
  Request r;
  r.op = op;
  // The packet's own transport, not the QP's: the stages drop a request
  // whose transport is not the QP's.
  r.qp_type = qp_type_of(packet.info.transport);
  r.src_qpn = config_.peer_qpn;
  if (h.xrceth) r.xrc_srqn = h.xrceth->srqn;
  r.solicited = h.bth.solicited;
  if (h.immdt) r.imm_data = htonl(h.immdt->imm);
  if (h.reth) {
    r.remote_addr = h.reth->va;
    r.rkey = h.reth->rkey;
    r.length = h.reth->dma_length;
  }
  if (h.atomic_eth) {
    r.remote_addr = h.atomic_eth->va;
    r.rkey = h.atomic_eth->rkey;
    if (op == Operation::kFetchAdd) {
      r.compare_add = h.atomic_eth->swap_add;
    } else {
      r.compare_add = h.atomic_eth->compare;
      r.swap = h.atomic_eth->swap_add;
    }
    r.length = 8;
  }
  return r;
}

void ResponderFlow::answer(const Syndrome& syndrome, uint32_t psn, PacketSink& out) {
  if (!config_.reliable || syndrome.answer == Answer::kSilence) return;
  count_sent_answer(config_.counters, syndrome.answer);
  wire::Headers h;
  h.bth.opcode = response_opcode(wire::Opcode::kRcAcknowledge);
  h.bth.dest_qpn = config_.peer_qpn;
  h.bth.reserved7 = answer_marks();
  h.bth.psn = psn;
  h.aeth = wire::Aeth{to_wire(syndrome), msn_};
  out.send(h, nullptr, 0, 0);
}

void ResponderFlow::ack(uint32_t psn, PacketSink& out) {
  if (acks_held_) {
    ack_owed_ = true;  // run_kept's one ACK, at the end
    return;
  }
  answer(Syndrome::ack(), psn, out);
}

void ResponderFlow::rnr_naked(uint32_t psn) {
  // The packets behind the refused one are dropped silently; the requester
  // sends again from it once the RNR timer ran out, and if that packet is
  // lost, the one after it shows the new round.
  nak_sent_ = true;
  last_gap_psn_ = psn;
  round_gap_psn_ = psn_add(psn, 1);
}

void ResponderFlow::remember(const ReadOrAtomic& r) {
  recent_.push_back(r);
  while (recent_.size() > config_.resources) recent_.pop_front();
}

void ResponderFlow::send_read_response(const ReadOrAtomic& read, const iovec& from, ResponderPort& port,
                                       PacketSink& out) {
  // One buffer for the flow's life: nothing on the data path allocates (an
  // application's signal handler that mallocs, as perftest -D's does, then
  // cannot land inside our allocation).
  if (bounce_.size() < config_.mtu) bounce_.resize(config_.mtu);
  const uint64_t length = read.request.length;
  for (uint32_t i = 0; i < read.npsn; ++i) {
    const wire::Segment segment = segment_of(i, read.npsn);
    wire::Headers h;
    switch (segment) {
      case wire::Segment::kFirst:
        h.bth.opcode = response_opcode(wire::Opcode::kRcRdmaReadResponseFirst);
        break;
      case wire::Segment::kMiddle:
        h.bth.opcode = response_opcode(wire::Opcode::kRcRdmaReadResponseMiddle);
        break;
      case wire::Segment::kLast:
        h.bth.opcode = response_opcode(wire::Opcode::kRcRdmaReadResponseLast);
        break;
      case wire::Segment::kOnly:
        h.bth.opcode = response_opcode(wire::Opcode::kRcRdmaReadResponseOnly);
        break;
    }
    h.bth.dest_qpn = config_.peer_qpn;
    h.bth.reserved7 = answer_marks();
    h.bth.psn = psn_add(read.psn, i);
    if (segment != wire::Segment::kMiddle)
      h.aeth = wire::Aeth{wire::Syndrome::ack(wire::Syndrome::kNoCredits), msn_};
    const uint64_t offset = uint64_t{i} * config_.mtu;
    const uint64_t bytes = length - offset < config_.mtu ? length - offset : config_.mtu;
    iovec chunk{bounce_.data(), static_cast<size_t>(bytes)};
    if (bytes > 0) {
      // Through the port, which reaches the owner's registered pages (and
      // reports a fault) rather than loading from an address the owner may
      // have unmapped since: a stopped response is asked for again, and
      // the READ then fails its checks.
      const iovec part{static_cast<char*>(from.iov_base) + offset, static_cast<size_t>(bytes)};
      if (port.read(&chunk, 1, &part, 1, bytes) != CopyStatus::kOk) return;
    }
    out.send(h, &chunk, bytes > 0 ? 1 : 0, static_cast<uint32_t>(bytes));
  }
}

void ResponderFlow::send_atomic_ack(const ReadOrAtomic& atomic, PacketSink& out) {
  wire::Headers h;
  h.bth.opcode = response_opcode(wire::Opcode::kRcAtomicAcknowledge);
  h.bth.dest_qpn = config_.peer_qpn;
  h.bth.reserved7 = answer_marks();
  h.bth.psn = atomic.psn;
  h.aeth = wire::Aeth{wire::Syndrome::ack(wire::Syndrome::kNoCredits), msn_};
  h.atomic_ack_eth = wire::AtomicAckEth{atomic.original};
  out.send(h, nullptr, 0, 0);
}

void ResponderFlow::duplicate(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  config_.counters.add(Counter::kDuplicateRequest);
  const uint32_t psn = packet.headers.bth.psn;
  for (const ReadOrAtomic& r : recent_) {
    if (r.atomic) {
      if (r.psn != psn) continue;
      send_atomic_ack(r, out);  // the atomic ran once: its result again, not the operation
      return;
    }
    if (psn_diff(psn, r.psn) < 0 || psn_diff(psn, psn_add(r.psn, r.npsn)) >= 0) continue;
    // A READ asked again, whole or from inside: answer what this request
    // asks (its RETH), from its PSN on, checked as a new READ would be.
    if (packet.info.operation != wire::Operation::kRdmaReadRequest) return;
    ReadOrAtomic again;
    again.psn = psn;
    again.request = request_of(packet, Operation::kRead);
    again.npsn = packets_for(again.request.length, config_.mtu);
    if (psn_diff(psn_add(again.psn, again.npsn), psn_add(r.psn, r.npsn)) > 0) return;  // not within the READ
    // The requester's tail probe (softhca's): it asks whether the READ came,
    // not for all of it again. Its first packet says so; the requester asks
    // for the rest only if that comes before the READ's own responses.
    if (peer_selective_ && (packet.headers.bth.reserved7 & kTailProbe) != 0 && again.npsn > 1) {
      again.request.length = config_.mtu;
      again.npsn = 1;
    }
    iovec from;
    if (recheck_read(again.request, port, from).syndrome.answer == Answer::kAck) send_read_response(again, from, port, out);
    return;
  }
  // A SEND or WRITE already received: say how far we are.
  ack(psn_add(epsn_, kPsnMask), out);
}

void ResponderFlow::send_or_write(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  const wire::Headers& h = packet.headers;
  const uint32_t psn = h.bth.psn;
  const wire::Segment segment = packet.info.segment;
  const bool send = packet.info.operation == wire::Operation::kSend;
  if (is_first(segment)) {
    if (in_message_) {
      // A new message before the last one ended: the requester broke the
      // opcode sequence. RC: invalid request; UC: the old message is lost.
      if (config_.reliable) {
        port.fail_qp(IBV_EVENT_QP_REQ_ERR);
        answer(Syndrome::nak(Answer::kNakInvalidRequest), psn, out);
        return;
      }
      if (message_.has_wqe) spare_wqe_ = message_.wqe;
      in_message_ = false;
    }
    const Request first = request_of(packet, send ? Operation::kSend : Operation::kWrite);
    const ReceiveWqe* reuse = send && spare_wqe_ ? &*spare_wqe_ : nullptr;
    const Response r = accept(first, port, config_.reliable, message_, reuse);
    if (r.syndrome.answer != Answer::kAck) {
      answer(r.syndrome, psn, out);
      if (r.syndrome.answer == Answer::kRnrNak) rnr_naked(psn);
      return;
    }
    if (reuse != nullptr) spare_wqe_.reset();
    in_message_ = true;
    message_start_psn_ = psn;
  } else if (!in_message_ || send != is_send(message_.op)) {
    // A middle or last packet with no message to continue, or continuing
    // one of the other kind (a SEND LAST inside a WRITE would complete a
    // receive WQE the WRITE never took): the opcode sequence is broken.
    if (config_.reliable) {
      port.fail_qp(IBV_EVENT_QP_REQ_ERR);
      answer(Syndrome::nak(Answer::kNakInvalidRequest), psn, out);
      return;
    }
    // UC: the rest of a message whose start was lost; one it broke is lost too.
    if (in_message_ && message_.has_wqe && is_send(message_.op)) spare_wqe_ = message_.wqe;
    in_message_ = false;
    return;
  }
  Request last = request_of(packet, message_.op);
  if (is_last(segment) && h.ieth) {
    last.op = Operation::kSendWithInv;
    last.invalidate_rkey = h.ieth->rkey;
  }
  if (is_last(segment) && h.immdt) {
    const Operation before = message_.op;
    message_.op = send ? Operation::kSendWithImm : Operation::kWriteWithImm;
    last.op = message_.op;
    const Response r = ready_for_last(message_, port);
    if (r.syndrome.answer != Answer::kAck) {
      // Refused (no receive WQE): the message stays what it was, or a LAST
      // without immediate for this PSN would complete a WQE never taken.
      message_.op = before;
      answer(r.syndrome, psn, out);
      if (r.syndrome.answer == Answer::kRnrNak) rnr_naked(psn);
      // The requester sends this packet again: an ONLY packet starts the
      // message afresh, a LAST one continues it.
      if (is_first(segment)) in_message_ = false;
      return;
    }
  }
  const iovec payload{const_cast<uint8_t*>(packet.payload.data()), packet.payload.size()};
  Response r = place(message_, &payload, packet.payload.empty() ? 0 : 1, packet.payload.size(), port);
  if (r.syndrome.answer != Answer::kAck) {
    in_message_ = false;
    answer(r.syndrome, psn, out);
    return;
  }
  if (is_last(segment)) {
    r = finish(message_, last, port);
    in_message_ = false;
    if (r.syndrome.answer != Answer::kAck) {
      // SEND WITH INVALIDATE of a key that cannot be invalidated.
      answer(r.syndrome, psn, out);
      return;
    }
    msn_ = psn_add(msn_, 1);
  }
  epsn_ = psn_add(psn, 1);
  if (h.bth.ack_req) ack(psn, out);
}

void ResponderFlow::read(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  const uint32_t psn = packet.headers.bth.psn;
  ReadOrAtomic r;
  r.psn = psn;
  r.request = request_of(packet, Operation::kRead);
  r.npsn = packets_for(r.request.length, config_.mtu);
  iovec from;
  const Response checked = accept_read(r.request, port, config_.reliable, from);
  if (checked.syndrome.answer != Answer::kAck) {
    answer(checked.syndrome, psn, out);
    return;
  }
  epsn_ = psn_add(psn, r.npsn);
  msn_ = psn_add(msn_, 1);
  remember(r);
  send_read_response(r, from, port, out);
}

void ResponderFlow::atomic(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  const uint32_t psn = packet.headers.bth.psn;
  Operation op = Operation::kCompareSwap;
  if (packet.info.operation == wire::Operation::kFetchAdd) op = Operation::kFetchAdd;
  if (packet.info.operation == wire::Operation::kAtomicWrite) op = Operation::kAtomicWrite;
  ReadOrAtomic a;
  a.psn = psn;
  a.atomic = op != Operation::kAtomicWrite;
  a.request = request_of(packet, op);
  if (op == Operation::kAtomicWrite) {
    if (packet.payload.size() != 8) {
      answer(Syndrome::nak(Answer::kNakInvalidRequest), psn, out);
      return;
    }
    std::memcpy(&a.request.compare_add, packet.payload.data(), 8);
    a.request.length = 8;
  }
  a.request.data = nullptr;
  a.request.ndata = 0;
  const Response r = respond(a.request, port, config_.reliable);
  if (r.syndrome.answer != Answer::kAck) {
    answer(r.syndrome, psn, out);
    return;
  }
  epsn_ = psn_add(psn, 1);
  msn_ = psn_add(msn_, 1);
  if (!a.atomic) {
    ack(psn, out);
    return;
  }
  a.original = r.atomic_original;
  remember(a);
  send_atomic_ack(a, out);
}

void ResponderFlow::on_request(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  receive(packet, port, out);
  // The requester's tail probe: it sent nothing for a while, so every
  // resend it sent before came or was lost; what is still missing, again.
  if (peer_selective_ && !kept_.empty() && (packet.headers.bth.reserved7 & kTailProbe) != 0 &&
      receives_in_state(port.qp().state))
    report_missing_before(seen_end_, UINT32_MAX, out);
}

void ResponderFlow::receive(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  // A QP in ERROR (or not yet receiving) answers nothing. The stages check
  // the state for each message, but a PSN gap was NAKed before them: a QP
  // that went to ERROR, whose NAK was lost, NAKed each resend's second
  // packet (the first dropped silently), and each NAK drew the resend again.
  if (!receives_in_state(port.qp().state)) {
    config_.counters.add(Counter::kClosedQpDrops);
    return;
  }
  // An opcode of another transport (UC at an RC QP, RC at a UC one) is
  // dropped and counted before its PSN means anything (as rxe's
  // check_type_psn): taken as the QP's own it was received, and ACKed.
  const wire::Transport expected =
      config_.xrc ? wire::Transport::kXrc : config_.reliable ? wire::Transport::kRc : wire::Transport::kUc;
  if (packet.info.transport != expected) {
    config_.counters.add(Counter::kMalformedDrops);
    return;
  }
  // XRC: every request packet names its SRQ; the port reaches it for this
  // packet's stages (a middle or last packet's too: the message's receive
  // WQE and CQ are that SRQ's). One that names none it can reach is taken
  // up by the stages (accept NAKs it).
  if (config_.xrc && packet.headers.xrceth) (void)port.select_xrc_srq(packet.headers.xrceth->srqn);
  const uint32_t psn = packet.headers.bth.psn;
  const int32_t d = psn_diff(psn, epsn_);
  // The requester marks every request; only one at the very PSN expected
  // turns keeping on, so that nobody who does not know the PSN can make
  // this end hold packets for later (admission.hpp keeps other hosts out).
  if (d == 0 && config_.selective && (packet.headers.bth.reserved7 & kSelective) != 0) peer_selective_ = true;
  if (config_.reliable) {
    if (d < 0) {
      duplicate(packet, port, out);
      return;
    }
    if (d > 0 && peer_selective_) {
      keep(packet, d, out);
      return;
    }
    if (d > 0) {
      // A gap: one NAK, then silence until the missing packet comes. But
      // when the requester began sending again from the gap and the packet
      // we wait for was lost once more, NAK again at once rather than leave
      // it to its timers. Such a round shows as PSNs that go back to where
      // the gap first showed, or before: two packets of one round merely
      // swapped on the way go back too, but not that far, and each NAK
      // costs the requester a retry.
      config_.counters.add(Counter::kOutOfSeqRequest);
      const bool new_round =
          nak_sent_ && psn_diff(psn, last_gap_psn_) < 0 && psn_diff(psn, round_gap_psn_) <= 0;
      last_gap_psn_ = psn;
      if (!nak_sent_ || new_round) {
        answer(Syndrome::nak(Answer::kNakSequenceError), epsn_, out);
        nak_sent_ = true;
        round_gap_psn_ = psn;
      }
      return;
    }
    nak_sent_ = false;
    if (peer_selective_) {
      if (kept_.empty() || psn_diff(seen_end_, epsn_) <= 0) {
        run(packet, port, out);
        seen_end_ = epsn_;
        return;
      }
      // The packet a hole waited for: it and what was kept behind it run
      // now, in PSN order, answered by one ACK.
      acks_held_ = true;
      const uint32_t before = epsn_;
      run(packet, port, out);
      if (epsn_ == before) {
        drop_kept();  // refused (RNR, an error): the requester sends again from it
        ack_owed_ = false;
      } else {
        clear_kept(before, epsn_);
        run_kept(port, out);
      }
      acks_held_ = false;
      if (ack_owed_) {
        ack_owed_ = false;
        ack(psn_add(epsn_, kPsnMask), out);
      }
      return;
    }
  } else if (d != 0) {
    // UC: a gap loses the message in progress; this packet starts afresh.
    config_.counters.add(Counter::kOutOfSeqRequest);
    if (in_message_) {
      if (message_.has_wqe && (message_.op == Operation::kSend || message_.op == Operation::kSendWithImm))
        spare_wqe_ = message_.wqe;
      in_message_ = false;
    }
    epsn_ = psn;
  }
  run(packet, port, out);
}

void ResponderFlow::run(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out) {
  port.running(packet.headers.bth.psn);
  switch (packet.info.operation) {
    case wire::Operation::kSend:
    case wire::Operation::kRdmaWrite:
      send_or_write(packet, port, out);
      return;
    case wire::Operation::kRdmaReadRequest:
      if (config_.reliable) read(packet, port, out);
      return;
    case wire::Operation::kCompareSwap:
    case wire::Operation::kFetchAdd:
    case wire::Operation::kAtomicWrite:
      if (config_.reliable) atomic(packet, port, out);
      return;
    default:
      return;  // responses are the requester's
  }
}

}  // namespace softhca::transport

namespace softhca::transport {

void ResponderFlow::keep(const wire::ParsedPacket& packet, int32_t ahead, PacketSink& out) {
  config_.counters.add(Counter::kOutOfSeqRequest);
  const wire::Headers& h = packet.headers;
  // A READ takes a PSN per response packet.
  uint32_t span = 1;
  if (packet.info.operation == wire::Operation::kRdmaReadRequest && h.reth)
    span = std::max<uint32_t>(1, packets_for(h.reth->dma_length, config_.mtu));
  // Past what is kept: as if lost (the requester's window keeps within it).
  if (uint64_t{static_cast<uint32_t>(ahead)} + span > kKeepPackets) return;
  // Longer than the path MTU: the stages refuse it when it comes in order.
  if (packet.payload.size() > config_.mtu) return;
  if (kept_.empty()) {
    kept_.resize(kKeepPackets);
    kept_bytes_ = std::make_unique_for_overwrite<uint8_t[]>(std::size_t{kKeepPackets} * config_.mtu);
  }
  const uint32_t psn = h.bth.psn;
  for (uint32_t i = 0; i < span; ++i) {
    if (slot(psn_add(psn, i)).state != Kept::State::kMissing) {
      config_.counters.add(Counter::kDuplicateRequest);  // kept already (or inside a kept READ)
      return;
    }
  }
  Kept& k = slot(psn);
  const uint32_t filled_report = k.reported;
  k.state = Kept::State::kKept;
  k.reported = 0;
  uint8_t* bytes = kept_bytes_.get() + std::size_t{psn % kKeepPackets} * config_.mtu;
  if (!packet.payload.empty()) std::memcpy(bytes, packet.payload.data(), packet.payload.size());
  k.packet = packet;
  k.packet.payload = std::span<const uint8_t>(bytes, packet.payload.size());
  for (uint32_t i = 1; i < span; ++i) {
    Kept& covered = slot(psn_add(psn, i));
    covered.state = Kept::State::kCovered;
    covered.reported = 0;
  }
  const uint32_t end = psn_add(psn, span);
  if (psn_diff(psn, seen_end_) > 0)
    report_hole(seen_end_, static_cast<uint32_t>(psn_diff(psn, seen_end_)), out);  // a new hole shows
  if (psn_diff(end, seen_end_) > 0) {
    seen_end_ = end;
  } else if ((h.bth.reserved7 & kResent) != 0 && filled_report != 0) {
    // The resend of a hole reported as `filled_report` came: holes reported
    // before it, whose resends should have come first, were lost again.
    report_missing_before(psn, filled_report, out);
  }
}

void ResponderFlow::report_hole(uint32_t first, uint32_t count, PacketSink& out) {
  if (++report_seq_ == 0) report_seq_ = 1;
  for (uint32_t i = 0; i < count && i < kKeepPackets; ++i) slot(psn_add(first, i)).reported = report_seq_;
  count_sent_answer(config_.counters, Answer::kNakSequenceError);
  wire::Headers h;
  h.bth.opcode = response_opcode(wire::Opcode::kRcAcknowledge);
  h.bth.dest_qpn = config_.peer_qpn;
  h.bth.reserved7 = kSelective | kHoleReport;
  h.bth.psn = first;
  h.aeth = wire::Aeth{wire::Syndrome::nak(wire::NakCode::kPsnSequenceError), count & kPsnMask};
  out.send(h, nullptr, 0, 0);
}

void ResponderFlow::report_missing_before(uint32_t end, uint32_t reported_before, PacketSink& out) {
  const auto needs_report = [&](uint32_t p) {
    const Kept& k = slot(p);
    return k.state == Kept::State::kMissing && k.reported < reported_before;
  };
  for (uint32_t p = epsn_; psn_diff(p, end) < 0;) {
    if (!needs_report(p)) {
      p = psn_add(p, 1);
      continue;
    }
    uint32_t n = 1;
    while (psn_diff(psn_add(p, n), end) < 0 && needs_report(psn_add(p, n))) ++n;
    report_hole(p, n, out);
    p = psn_add(p, n);
  }
}

void ResponderFlow::drop_kept() {
  clear_kept(epsn_, seen_end_);
  seen_end_ = epsn_;
}

void ResponderFlow::run_kept(ResponderPort& port, PacketSink& out) {
  while (psn_diff(seen_end_, epsn_) > 0) {
    Kept& k = slot(epsn_);
    if (k.state != Kept::State::kKept || k.packet.headers.bth.psn != epsn_) break;
    const uint32_t before = epsn_;
    run(k.packet, port, out);
    ack_owed_ = true;
    if (epsn_ == before || !receives_in_state(port.qp().state)) {
      drop_kept();
      return;
    }
    clear_kept(before, epsn_);
  }
  if (psn_diff(epsn_, seen_end_) > 0) seen_end_ = epsn_;
}

void ResponderFlow::clear_kept(uint32_t from, uint32_t to) {
  if (kept_.empty() || psn_diff(to, from) <= 0) return;
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(psn_diff(to, from)), kKeepPackets);
  for (uint32_t i = 0; i < n; ++i) {
    Kept& k = slot(psn_add(from, i));
    k.state = Kept::State::kMissing;
    k.reported = 0;
  }
}

}  // namespace softhca::transport
