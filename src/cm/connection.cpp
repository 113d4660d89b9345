#include "cm/connection.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/limits.hpp"

namespace softhca::cm {
namespace {

template <std::size_t N>
void copy_private(std::array<uint8_t, N>& dst, std::span<const uint8_t> src) {
  dst.fill(0);
  if (!src.empty()) std::memcpy(dst.data(), src.data(), std::min(src.size(), N));
}

template <std::size_t N>
void set_event_private(EventOut& ev, const std::array<uint8_t, N>& src, std::size_t offset = 0) {
  const std::size_t len = std::min(N - offset, kMaxEventPrivateData);
  std::memcpy(ev.private_data.data(), src.data() + offset, len);
  ev.private_data_len = static_cast<uint8_t>(len);
}

EventOut event(CmEventType type, int status = 0) {
  EventOut ev;
  ev.type = type;
  ev.status = status;
  return ev;
}

}  // namespace

const char* conn_state_name(ConnState state) {
  switch (state) {
    case ConnState::kIdle: return "IDLE";
    case ConnState::kReqSent: return "REQ_SENT";
    case ConnState::kRepRcvd: return "REP_RCVD";
    case ConnState::kReqRcvd: return "REQ_RCVD";
    case ConnState::kRepSent: return "REP_SENT";
    case ConnState::kEstablished: return "ESTABLISHED";
    case ConnState::kDreqSent: return "DREQ_SENT";
    case ConnState::kTimewait: return "TIMEWAIT";
    case ConnState::kSidrReqSent: return "SIDR_REQ_SENT";
    case ConnState::kSidrReqRcvd: return "SIDR_REQ_RCVD";
  }
  return "UNKNOWN";
}

Result<Step> Connection::connect(const ConnectArgs& args) {
  if (state_ != ConnState::kIdle || has_cm_) return fail(std::errc::invalid_argument);
  local_comm_id_ = args.local_comm_id;
  remote_comm_id_ = 0;
  local_ca_guid_ = args.local_ca_guid;
  neg_ = Negotiated{};
  neg_.qp_type = args.qp_type;
  neg_.local_qpn = args.qpn & 0xFFFFFF;
  neg_.local_psn = args.starting_psn & 0xFFFFFF;
  neg_.responder_resources = args.responder_resources;
  neg_.initiator_depth = args.initiator_depth;
  neg_.retry_count = std::min<uint8_t>(args.retry_count, 7);
  neg_.rnr_retry_count = std::min<uint8_t>(args.rnr_retry_count, 7);
  neg_.flow_control = args.flow_control;
  neg_.srq = args.srq;
  neg_.path = args.path;

  ReqMsg req;
  req.local_comm_id = local_comm_id_;
  req.service_id = args.service_id;
  req.local_ca_guid = args.local_ca_guid;
  req.local_qpn = neg_.local_qpn;
  req.responder_resources = args.responder_resources;
  req.initiator_depth = args.initiator_depth;
  req.remote_cm_response_timeout = args.timeouts.response_timeout & 0x1F;
  req.transport = args.qp_type == IBV_QPT_UC ? TransportType::kUc : TransportType::kRc;
  req.end_to_end_flow_control = args.flow_control;
  req.starting_psn = neg_.local_psn;
  req.local_cm_response_timeout = args.timeouts.response_timeout & 0x1F;
  req.retry_count = neg_.retry_count;
  req.pkey = args.path.pkey;
  req.path_mtu = args.path.mtu;
  req.rnr_retry_count = neg_.rnr_retry_count;
  req.max_cm_retries = args.timeouts.max_retries & 0xF;
  req.srq = args.srq;
  req.primary_local_gid = args.path.sgid;
  req.primary_remote_gid = args.path.dgid;
  req.primary_flow_label = args.path.flow_label;
  req.primary_packet_rate = 0;
  req.primary_traffic_class = args.path.traffic_class;
  req.primary_hop_limit = args.path.hop_limit;
  req.primary_sl = 0;
  req.primary_subnet_local = true;
  req.primary_local_ack_timeout = args.path.local_ack_timeout;
  req.private_data = args.private_data;

  state_ = ConnState::kReqSent;
  has_cm_ = true;
  // ib_cm's active side: two packet lifetimes plus the peer's response time.
  answer_ms_ = 2 * iba_time_ms(kPacketLifeTime) + iba_time_ms(req.remote_cm_response_timeout);
  max_retries_ = req.max_cm_retries;
  await_answer(CmMessage(req), answer_ms_, max_retries_);
  return Step{CmMessage(req), std::nullopt};
}

Connection Connection::from_req(const ReqMsg& req, uint32_t local_comm_id, uint32_t local_psn, const PathInfo& path,
                                std::size_t user_offset, Step& step) {
  Connection c;
  c.state_ = ConnState::kReqRcvd;
  c.has_cm_ = true;
  c.local_comm_id_ = local_comm_id;
  c.remote_comm_id_ = req.local_comm_id;
  c.neg_.qp_type = req.transport == TransportType::kUc ? IBV_QPT_UC : IBV_QPT_RC;
  c.neg_.remote_qpn = req.local_qpn;
  c.neg_.remote_psn = req.starting_psn;
  c.neg_.local_psn = local_psn & 0xFFFFFF;
  // The receiver's point of view: it answers the sender's reads (its
  // responder resources are the sender's initiator depth) and vice versa.
  c.neg_.responder_resources = req.initiator_depth;
  c.neg_.initiator_depth = req.responder_resources;
  c.neg_.retry_count = req.retry_count;
  c.neg_.rnr_retry_count = req.rnr_retry_count;
  c.neg_.flow_control = req.end_to_end_flow_control;
  c.neg_.remote_srq = req.srq;
  c.neg_.remote_ca_guid = req.local_ca_guid;
  c.neg_.path = path;
  c.neg_.path.mtu = std::min<uint8_t>(req.path_mtu == 0 ? path.mtu : req.path_mtu, path.mtu);
  // ib_cm's passive side waits as long as the REQ says its sender answers in.
  c.answer_ms_ = iba_time_ms(req.local_cm_response_timeout);
  c.max_retries_ = req.max_cm_retries;

  EventOut ev = event(CmEventType::kConnectRequest);
  ev.param.responder_resources = req.initiator_depth;
  ev.param.initiator_depth = req.responder_resources;
  ev.param.flow_control = req.end_to_end_flow_control ? 1 : 0;
  ev.param.retry_count = req.retry_count;
  ev.param.rnr_retry_count = req.rnr_retry_count;
  ev.param.srq = req.srq ? 1 : 0;
  ev.param.qp_num = req.local_qpn;
  set_event_private(ev, req.private_data, std::min(user_offset, kReqPrivateDataSize));
  step = Step{CmMessage(c.make_mra()), ev};
  return c;
}

Result<Step> Connection::accept(const AcceptArgs& args) {
  if (state_ != ConnState::kReqRcvd) return fail(std::errc::invalid_argument);
  if (args.private_data.size() > kRepPrivateDataSize) return fail(std::errc::invalid_argument);
  neg_.local_qpn = args.qpn & 0xFFFFFF;
  neg_.responder_resources = args.responder_resources;
  neg_.initiator_depth = args.initiator_depth;
  neg_.srq = args.srq;
  neg_.flow_control = args.flow_control;

  RepMsg rep;
  rep.local_comm_id = local_comm_id_;
  rep.remote_comm_id = remote_comm_id_;
  rep.local_qpn = neg_.local_qpn;
  rep.starting_psn = neg_.local_psn;
  rep.responder_resources = args.responder_resources;
  rep.initiator_depth = args.initiator_depth;
  rep.target_ack_delay = static_cast<uint8_t>(limits::kLocalCaAckDelay & 0x1F);
  rep.failover_accepted = 0;
  rep.end_to_end_flow_control = args.flow_control;
  rep.rnr_retry_count = std::min<uint8_t>(args.rnr_retry_count, 7);
  rep.srq = args.srq;
  rep.local_ca_guid = args.local_ca_guid;
  copy_private(rep.private_data, args.private_data);

  state_ = ConnState::kRepSent;
  await_answer(CmMessage(rep), answer_ms_, max_retries_);
  return Step{CmMessage(rep), std::nullopt};
}

Result<Step> Connection::sidr_request(const SidrArgs& args) {
  if (state_ != ConnState::kIdle || has_cm_) return fail(std::errc::invalid_argument);
  local_comm_id_ = args.local_comm_id;
  service_id_ = args.service_id;
  neg_ = Negotiated{};
  neg_.qp_type = IBV_QPT_UD;
  neg_.path = args.path;
  SidrReqMsg req;
  req.request_id = local_comm_id_;
  req.pkey = args.pkey;
  req.service_id = args.service_id;
  req.private_data = args.private_data;
  state_ = ConnState::kSidrReqSent;
  has_cm_ = true;
  // rdma_cm's SIDR_REQ waits the response time alone.
  answer_ms_ = iba_time_ms(args.timeouts.response_timeout & 0x1F);
  max_retries_ = args.timeouts.max_retries & 0xF;
  await_answer(CmMessage(req), answer_ms_, max_retries_);
  return Step{CmMessage(req), std::nullopt};
}

Connection Connection::from_sidr_req(const SidrReqMsg& req, uint32_t local_comm_id, const PathInfo& path,
                                     std::size_t user_offset, Step& step) {
  Connection c;
  c.state_ = ConnState::kSidrReqRcvd;
  c.has_cm_ = true;
  c.local_comm_id_ = local_comm_id;
  c.remote_comm_id_ = req.request_id;
  c.service_id_ = req.service_id;
  c.neg_.qp_type = IBV_QPT_UD;
  c.neg_.path = path;
  EventOut ev = event(CmEventType::kConnectRequest);
  set_event_private(ev, req.private_data, std::min(user_offset, kSidrReqPrivateDataSize));
  step = Step{std::nullopt, ev};
  return c;
}

SidrRepMsg Connection::make_sidr_rep(SidrStatus status, std::span<const uint8_t> private_data) const {
  SidrRepMsg rep;
  rep.request_id = remote_comm_id_;
  rep.status = static_cast<uint8_t>(status);
  rep.service_id = service_id_;
  copy_private(rep.private_data, private_data);
  return rep;
}

Result<Step> Connection::sidr_accept(uint32_t qpn, uint32_t qkey, std::span<const uint8_t> private_data) {
  if (state_ != ConnState::kSidrReqRcvd) return fail(std::errc::invalid_argument);
  if (private_data.size() > kSidrRepPrivateDataSize) return fail(std::errc::invalid_argument);
  neg_.local_qpn = qpn & 0xFFFFFF;
  SidrRepMsg rep = make_sidr_rep(SidrStatus::kSuccess, private_data);
  rep.qpn = neg_.local_qpn;
  rep.qkey = qkey;
  state_ = ConnState::kIdle;
  return Step{CmMessage(rep), std::nullopt};
}

Step Connection::on_sidr_rep(const SidrRepMsg& rep) {
  if (state_ != ConnState::kSidrReqSent) return Step{};
  state_ = ConnState::kIdle;
  EventOut ev;
  if (rep.status == static_cast<uint8_t>(SidrStatus::kSuccess)) {
    neg_.remote_qpn = rep.qpn;
    ev = event(CmEventType::kEstablished);
    ev.param.qp_num = rep.qpn;
    ev.qkey = rep.qkey;
  } else {
    ev = event(CmEventType::kUnreachable, rep.status);
  }
  set_event_private(ev, rep.private_data);
  return Step{std::nullopt, ev};
}

RejMsg Connection::make_rej(uint16_t reason, RejectedMessage which, std::span<const uint8_t> private_data) const {
  RejMsg rej;
  rej.local_comm_id = local_comm_id_;
  rej.remote_comm_id = remote_comm_id_;
  rej.message_rejected = which;
  rej.reason = reason;
  copy_private(rej.private_data, private_data);
  return rej;
}

Result<Step> Connection::reject(std::span<const uint8_t> private_data, uint16_t reason) {
  if (private_data.size() > kRejPrivateDataSize) return fail(std::errc::invalid_argument);
  RejectedMessage which;
  if (state_ == ConnState::kSidrReqRcvd) {
    if (private_data.size() > kSidrRepPrivateDataSize) return fail(std::errc::invalid_argument);
    SidrRepMsg rep = make_sidr_rep(SidrStatus::kReject, private_data);
    state_ = ConnState::kIdle;
    return Step{CmMessage(rep), std::nullopt};
  }
  if (state_ == ConnState::kReqRcvd) {
    which = RejectedMessage::kReq;
  } else if (state_ == ConnState::kRepRcvd) {
    which = RejectedMessage::kRep;
  } else {
    return fail(std::errc::invalid_argument);
  }
  RejMsg rej = make_rej(reason, which, private_data);
  state_ = ConnState::kIdle;
  return Step{CmMessage(rej), std::nullopt};
}

Result<Step> Connection::establish() {
  if (state_ != ConnState::kRepRcvd) return fail(std::errc::invalid_argument);
  RtuMsg rtu;
  rtu.local_comm_id = local_comm_id_;
  rtu.remote_comm_id = remote_comm_id_;
  state_ = ConnState::kEstablished;
  return Step{CmMessage(rtu), std::nullopt};
}

Result<Step> Connection::notify_established() {
  if (state_ == ConnState::kEstablished) return fail(std::errc::already_connected);
  if (state_ != ConnState::kRepSent) return fail(std::errc::invalid_argument);
  state_ = ConnState::kEstablished;
  return Step{std::nullopt, event(CmEventType::kEstablished)};
}

Result<Step> Connection::disconnect() {
  if (!has_cm_) return fail(std::errc::invalid_argument);
  if (state_ != ConnState::kEstablished) return Step{};
  DreqMsg dreq;
  dreq.local_comm_id = local_comm_id_;
  dreq.remote_comm_id = remote_comm_id_;
  dreq.remote_qpn = neg_.remote_qpn;
  state_ = ConnState::kDreqSent;
  await_answer(CmMessage(dreq), answer_ms_, max_retries_);
  return Step{CmMessage(dreq), std::nullopt};
}

Step Connection::on_rep(const RepMsg& rep) {
  if (state_ == ConnState::kEstablished && rep.local_comm_id == remote_comm_id_) {
    // The peer sent its REP again: our RTU is late or lost; repeat it.
    RtuMsg rtu;
    rtu.local_comm_id = local_comm_id_;
    rtu.remote_comm_id = remote_comm_id_;
    return Step{CmMessage(rtu), std::nullopt};
  }
  if (state_ != ConnState::kReqSent) return Step{};  // a duplicate or a stale REP
  remote_comm_id_ = rep.local_comm_id;
  neg_.remote_qpn = rep.local_qpn;
  neg_.remote_psn = rep.starting_psn;
  neg_.initiator_depth = rep.responder_resources;
  neg_.responder_resources = rep.initiator_depth;
  neg_.rnr_retry_count = rep.rnr_retry_count;
  // Our QP's ACK timeout: the REQ's path, with the ACK delay the peer's CA
  // announces (cm_rep_handler does the same).
  if (neg_.path.local_ack_timeout != 0)
    neg_.path.local_ack_timeout =
        cm_ack_timeout(rep.target_ack_delay, static_cast<uint8_t>(neg_.path.local_ack_timeout - 1));
  neg_.remote_srq = rep.srq;
  neg_.remote_ca_guid = rep.local_ca_guid;
  state_ = ConnState::kRepRcvd;

  EventOut ev = event(CmEventType::kConnectResponse);
  ev.param.responder_resources = rep.initiator_depth;
  ev.param.initiator_depth = rep.responder_resources;
  ev.param.flow_control = rep.end_to_end_flow_control ? 1 : 0;
  ev.param.rnr_retry_count = rep.rnr_retry_count;
  ev.param.srq = rep.srq ? 1 : 0;
  ev.param.qp_num = rep.local_qpn;
  set_event_private(ev, rep.private_data);
  return Step{std::nullopt, ev};
}

Step Connection::on_rej(const RejMsg& rej) {
  switch (state_) {
    case ConnState::kReqSent:
    case ConnState::kRepRcvd:
    case ConnState::kReqRcvd:
    case ConnState::kRepSent: {
      state_ = ConnState::kIdle;
      EventOut ev = event(CmEventType::kRejected, rej.reason);
      set_event_private(ev, rej.private_data);
      return Step{std::nullopt, ev};
    }
    default:
      return Step{};
  }
}

Step Connection::on_dreq(const DreqMsg&) {
  DrepMsg drep;
  drep.local_comm_id = local_comm_id_;
  drep.remote_comm_id = remote_comm_id_;
  switch (state_) {
    case ConnState::kEstablished:
    case ConnState::kDreqSent:
    case ConnState::kRepSent:
      state_ = ConnState::kTimewait;
      return Step{CmMessage(drep), event(CmEventType::kDisconnected)};
    case ConnState::kTimewait:
      return Step{CmMessage(drep), std::nullopt};  // our DREP was lost or crossed: answer again
    default:
      return Step{};
  }
}

Step Connection::on_message(const CmMessage& msg) {
  if (const auto* rep = std::get_if<RepMsg>(&msg)) return on_rep(*rep);
  if (const auto* rej = std::get_if<RejMsg>(&msg)) return on_rej(*rej);
  if (std::holds_alternative<RtuMsg>(msg)) {
    if (state_ != ConnState::kRepSent) return Step{};
    state_ = ConnState::kEstablished;
    return Step{std::nullopt, event(CmEventType::kEstablished)};
  }
  if (const auto* dreq = std::get_if<DreqMsg>(&msg)) return on_dreq(*dreq);
  if (const auto* sidr = std::get_if<SidrRepMsg>(&msg)) return on_sidr_rep(*sidr);
  if (const auto* mra = std::get_if<MraMsg>(&msg)) {
    // The peer got our message and will answer within its service timeout:
    // wait that long (plus a packet lifetime) before asking again.
    const bool ours = (state_ == ConnState::kReqSent && mra->message_mraed == MraedMessage::kReq) ||
                      (state_ == ConnState::kRepSent && mra->message_mraed == MraedMessage::kRep);
    if (ours && awaited_) {
      wait_ms_ = iba_time_ms(mra->service_timeout & 0x1F) + iba_time_ms(kPacketLifeTime);
      ++generation_;
    }
    return Step{};
  }
  if (std::holds_alternative<DrepMsg>(msg)) {
    if (state_ != ConnState::kDreqSent) return Step{};
    state_ = ConnState::kTimewait;
    return Step{std::nullopt, event(CmEventType::kDisconnected)};
  }
  return Step{};  // a REQ never reaches an existing connection
}

Step Connection::on_duplicate_req() const {
  if (state_ != ConnState::kReqRcvd) return Step{};
  return Step{CmMessage(make_mra()), std::nullopt};
}

MraMsg Connection::make_mra() const {
  MraMsg mra;
  mra.local_comm_id = local_comm_id_;
  mra.remote_comm_id = remote_comm_id_;
  mra.message_mraed = MraedMessage::kReq;
  mra.service_timeout = kMraServiceTimeout;
  return mra;
}

void Connection::await_answer(const CmMessage& msg, uint32_t timeout_ms, uint8_t retries) {
  awaited_ = msg;
  wait_ms_ = timeout_ms;
  retries_left_ = retries;
  ++generation_;
}

bool Connection::awaiting_state() const {
  switch (state_) {
    case ConnState::kReqSent:
    case ConnState::kRepSent:
    case ConnState::kDreqSent:
    case ConnState::kSidrReqSent:
      return true;
    default:
      return false;
  }
}

std::optional<Retransmit> Connection::retransmit() const {
  if (!awaited_ || !awaiting_state()) return std::nullopt;
  return Retransmit{generation_, wait_ms_};
}

Step Connection::on_timeout(uint32_t generation) {
  if (generation != generation_ || !retransmit()) return Step{};
  if (retries_left_ > 0) {
    --retries_left_;
    ++generation_;
    return Step{*awaited_, std::nullopt};
  }
  // Out of retries: what ib_cm reports, and rdma_cm turns into these events.
  awaited_.reset();
  switch (state_) {
    case ConnState::kReqSent:
    case ConnState::kSidrReqSent:
      state_ = ConnState::kIdle;
      return Step{std::nullopt, event(CmEventType::kUnreachable, -ETIMEDOUT)};
    case ConnState::kRepSent:
      state_ = ConnState::kTimewait;
      return Step{std::nullopt, event(CmEventType::kUnreachable, -ETIMEDOUT)};
    case ConnState::kDreqSent:
      state_ = ConnState::kTimewait;
      return Step{std::nullopt, event(CmEventType::kDisconnected, -ETIMEDOUT)};
    default:
      return Step{};
  }
}

Step Connection::on_peer_lost() {
  switch (state_) {
    case ConnState::kReqSent:
    case ConnState::kRepRcvd:
    case ConnState::kRepSent: {
      // The peer's CM, destroying its end in REQ_RCVD/REP_SENT/REP_RCVD,
      // would have sent a consumer-defined REJ.
      RejMsg rej = make_rej(static_cast<uint16_t>(RejReason::kConsumerDefined), RejectedMessage::kOther, {});
      return on_rej(rej);
    }
    case ConnState::kReqRcvd: {
      // ... and in REQ_SENT a REJ with reason "timeout".
      RejMsg rej = make_rej(static_cast<uint16_t>(RejReason::kTimeout), RejectedMessage::kOther, {});
      return on_rej(rej);
    }
    case ConnState::kEstablished:
    case ConnState::kDreqSent:
      state_ = ConnState::kTimewait;
      return Step{std::nullopt, event(CmEventType::kDisconnected)};
    case ConnState::kSidrReqSent:
      // Nobody will answer: what the kernel reports when its SIDR_REQ
      // retries run out.
      state_ = ConnState::kIdle;
      return Step{std::nullopt, event(CmEventType::kUnreachable, -ETIMEDOUT)};
    default:
      return Step{};
  }
}

Step Connection::on_destroy() {
  Step step;
  switch (state_) {
    case ConnState::kReqSent: {
      // The peer does not know our comm id's pair yet: ib_cm finds the
      // connection a timeout REJ ends by the REJ's local comm id and the CA
      // GUID in its additional reject information, big-endian.
      RejMsg rej = make_rej(static_cast<uint16_t>(RejReason::kTimeout), RejectedMessage::kOther, {});
      rej.ari_length = 8;
      for (std::size_t i = 0; i < 8; ++i) rej.ari[i] = static_cast<uint8_t>(local_ca_guid_ >> (56 - 8 * i));
      step.send = CmMessage(rej);
      break;
    }
    case ConnState::kReqRcvd:
      step.send = CmMessage(make_rej(static_cast<uint16_t>(RejReason::kConsumerDefined), RejectedMessage::kReq, {}));
      break;
    case ConnState::kRepRcvd:
      step.send = CmMessage(make_rej(static_cast<uint16_t>(RejReason::kConsumerDefined), RejectedMessage::kRep, {}));
      break;
    case ConnState::kRepSent:
      step.send = CmMessage(make_rej(static_cast<uint16_t>(RejReason::kConsumerDefined), RejectedMessage::kOther, {}));
      break;
    case ConnState::kSidrReqRcvd:
      step.send = CmMessage(make_sidr_rep(SidrStatus::kReject, {}));
      break;
    case ConnState::kEstablished: {
      DreqMsg dreq;
      dreq.local_comm_id = local_comm_id_;
      dreq.remote_comm_id = remote_comm_id_;
      dreq.remote_qpn = neg_.remote_qpn;
      step.send = CmMessage(dreq);
      break;
    }
    default:
      break;
  }
  state_ = ConnState::kIdle;
  return step;
}

std::optional<Connection::Departure> Connection::departure() const {
  if (!has_cm_) return std::nullopt;
  // REP_SENT too: the peer may have sent the RTU that was lost, and be
  // connected, or disconnecting with a DREQ of its own that was lost too
  // (on_destroy's REJ ends it only in the handshake). Such a peer, its DREQ
  // unanswered once this process is gone, waited out all its retries.
  if (state_ == ConnState::kEstablished || state_ == ConnState::kRepSent) {
    Departure d;
    d.dreq.local_comm_id = local_comm_id_;
    d.dreq.remote_comm_id = remote_comm_id_;
    d.dreq.remote_qpn = neg_.remote_qpn;
    d.wait_ms = answer_ms_;
    d.retries = max_retries_;
    return d;
  }
  if (state_ == ConnState::kDreqSent && awaited_) {
    if (const auto* dreq = std::get_if<DreqMsg>(&*awaited_)) return Departure{*dreq, wait_ms_, retries_left_};
  }
  return std::nullopt;
}

Step Connection::on_exit() {
  if (state_ == ConnState::kTimewait) {
    DrepMsg drep;
    drep.local_comm_id = local_comm_id_;
    drep.remote_comm_id = remote_comm_id_;
    state_ = ConnState::kIdle;
    return Step{CmMessage(drep), std::nullopt};
  }
  return on_destroy();
}

Result<QpAttrPlan> init_qp_attr(const Connection& conn, ibv_qp_type qp_type, uint8_t port_num, uint16_t pkey_index,
                                uint32_t qkey, ibv_qp_state target) {
  QpAttrPlan plan;
  ibv_qp_attr& a = plan.attr;
  const Negotiated& n = conn.negotiated();
  a.qp_state = target;
  switch (target) {
    case IBV_QPS_INIT:
      a.port_num = port_num;
      a.pkey_index = pkey_index;
      plan.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (qp_type == IBV_QPT_UD) {
        a.qkey = qkey;
        plan.mask |= IBV_QP_QKEY;
      } else {
        a.qp_access_flags = 0;
        if (conn.has_cm()) {
          a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (n.responder_resources != 0) a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        plan.mask |= IBV_QP_ACCESS_FLAGS;
      }
      return plan;
    case IBV_QPS_RTR: {
      if (qp_type == IBV_QPT_UD) {
        plan.mask = IBV_QP_STATE;
        return plan;
      }
      const ConnState s = conn.state();
      if (!conn.has_cm() || s == ConnState::kIdle || s == ConnState::kReqSent) return fail(std::errc::invalid_argument);
      a.path_mtu = static_cast<ibv_mtu>(n.path.mtu);
      a.dest_qp_num = n.remote_qpn;
      a.rq_psn = n.local_psn;  // what our REQ or REP announced (Negotiated)
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, n.path.dgid.data(), 16);
      a.ah_attr.grh.sgid_index = n.path.sgid_index;
      a.ah_attr.grh.hop_limit = n.path.hop_limit;
      a.ah_attr.grh.traffic_class = n.path.traffic_class;
      a.ah_attr.grh.flow_label = n.path.flow_label;
      a.ah_attr.port_num = port_num;
      plan.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      // Responders: RC and XRC TGT QPs.
      if (qp_type == IBV_QPT_RC || qp_type == IBV_QPT_XRC_RECV) {
        a.max_dest_rd_atomic = n.responder_resources;
        a.min_rnr_timer = 0;
        plan.mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return plan;
    }
    case IBV_QPS_RTS: {
      if (qp_type == IBV_QPT_UD) {
        a.sq_psn = 0;
        plan.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        return plan;
      }
      const ConnState s = conn.state();
      if (!conn.has_cm() || s == ConnState::kIdle || s == ConnState::kReqSent) return fail(std::errc::invalid_argument);
      a.sq_psn = n.remote_psn;  // what the peer's REQ or REP announced
      plan.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (qp_type == IBV_QPT_XRC_RECV) {
        a.timeout = n.path.local_ack_timeout;  // all a TGT QP takes (and needs) at RTS
        plan.mask |= IBV_QP_TIMEOUT;
      }
      // Requesters: RC and XRC INI QPs.
      if (qp_type == IBV_QPT_RC || qp_type == IBV_QPT_XRC_SEND) {
        a.timeout = n.path.local_ack_timeout;
        a.retry_cnt = n.retry_count;
        a.rnr_retry = n.rnr_retry_count;
        a.max_rd_atomic = n.initiator_depth;
        plan.mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return plan;
    }
    default:
      return fail(std::errc::invalid_argument);
  }
}

}  // namespace softhca::cm
