#include "transport/responder_flow.hpp"

#include <arpa/inet.h>

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

ResponderFlow::ResponderFlow(const ResponderConfig& config) : config_(config), epsn_(config.start_psn & kPsnMask) {
  if (config_.resources == 0) config_.resources = 1;
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
  h.bth.psn = psn;
  h.aeth = wire::Aeth{to_wire(syndrome), msn_};
  out.send(h, nullptr, 0, 0);
}

void ResponderFlow::ack(uint32_t psn, PacketSink& out) { answer(Syndrome::ack(), psn, out); }

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
  std::vector<unsigned char> bounce(config_.mtu);
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
    h.bth.psn = psn_add(read.psn, i);
    if (segment != wire::Segment::kMiddle)
      h.aeth = wire::Aeth{wire::Syndrome::ack(wire::Syndrome::kNoCredits), msn_};
    const uint64_t offset = uint64_t{i} * config_.mtu;
    const uint64_t bytes = length - offset < config_.mtu ? length - offset : config_.mtu;
    iovec chunk{bounce.data(), static_cast<size_t>(bytes)};
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
  // A QP in ERROR (or not yet receiving) answers nothing. The stages check
  // the state for each message, but a PSN gap was NAKed before them: a QP
  // that went to ERROR, whose NAK was lost, NAKed each resend's second
  // packet (the first dropped silently), and each NAK drew the resend again.
  if (!receives_in_state(port.qp().state)) return;
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
  if (config_.reliable) {
    if (d < 0) {
      duplicate(packet, port, out);
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
