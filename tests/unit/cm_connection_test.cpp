// The connection state machine (cm/connection.hpp) on its own: two ends
// passing messages to each other by hand, with the events, values and QP
// attributes rdma_cm gives, and every way a handshake or a connection ends.
#include "cm/connection.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string_view>

namespace softhca::cm {
namespace {

constexpr uint32_t kActiveComm = 0x1000;
constexpr uint32_t kPassiveComm = 0x2000;

PathInfo path_from(uint8_t s, uint8_t d) {
  PathInfo p;
  p.sgid[10] = p.sgid[11] = p.dgid[10] = p.dgid[11] = 0xff;
  p.sgid[12] = p.dgid[12] = 127;
  p.sgid[15] = s;
  p.dgid[15] = d;
  p.sgid_index = 0;
  return p;
}

ConnectArgs connect_args(std::string_view user_data = {}) {
  ConnectArgs a;
  a.local_comm_id = kActiveComm;
  a.service_id = service_id(0x0106, 7174);
  a.local_ca_guid = 0xAAAA;
  a.qpn = 0x11;
  a.starting_psn = 0x100;
  a.responder_resources = 1;   // the active side answers 1 read
  a.initiator_depth = 4;       // and issues up to 4
  a.retry_count = 6;
  a.rnr_retry_count = 5;
  a.path = path_from(1, 1);
  if (!user_data.empty()) std::memcpy(a.private_data.data() + kIpHeaderSize, user_data.data(), user_data.size());
  return a;
}

AcceptArgs accept_args(std::span<const uint8_t> pd = {}) {
  AcceptArgs a;
  a.qpn = 0x22;
  a.responder_resources = 4;
  a.initiator_depth = 1;
  a.rnr_retry_count = 3;
  a.local_ca_guid = 0xBBBB;
  a.private_data = pd;
  return a;
}

// Runs REQ -> REP on two fresh ends; returns them in REP_RCVD / REP_SENT.
struct Pair {
  Connection active;
  Connection passive;
  Step req_event;  // the passive CONNECT_REQUEST
  Step rep_event;  // the active CONNECT_RESPONSE
};

Pair handshake_to_rep(std::string_view user_data = {}) {
  Pair p;
  auto s1 = p.active.connect(connect_args(user_data));
  EXPECT_TRUE(s1.has_value());
  const auto& req = std::get<ReqMsg>(*s1->send);
  p.passive = Connection::from_req(req, kPassiveComm, 0x300, path_from(1, 1), kIpHeaderSize, p.req_event);
  auto s2 = p.passive.accept(accept_args());
  EXPECT_TRUE(s2.has_value());
  p.rep_event = p.active.on_message(*s2->send);
  return p;
}

TEST(CmConnection, FullHandshakeAndValues) {
  Connection active;
  EXPECT_FALSE(active.has_cm());
  auto s1 = active.connect(connect_args("hello"));
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(active.state(), ConnState::kReqSent);
  ASSERT_TRUE(s1->send && std::holds_alternative<ReqMsg>(*s1->send));
  EXPECT_FALSE(s1->event);
  const ReqMsg req = std::get<ReqMsg>(*s1->send);
  EXPECT_EQ(req.local_comm_id, kActiveComm);
  EXPECT_EQ(req.local_qpn, 0x11u);
  EXPECT_EQ(req.starting_psn, 0x100u);
  EXPECT_EQ(req.responder_resources, 1);
  EXPECT_EQ(req.initiator_depth, 4);
  EXPECT_EQ(req.retry_count, 6);
  EXPECT_EQ(req.rnr_retry_count, 5);
  EXPECT_EQ(req.path_mtu, IBV_MTU_4096);

  Step ev;
  Connection passive = Connection::from_req(req, kPassiveComm, 0x300, path_from(1, 1), kIpHeaderSize, ev);
  EXPECT_EQ(passive.state(), ConnState::kReqRcvd);
  ASSERT_TRUE(ev.event);
  EXPECT_EQ(ev.event->type, CmEventType::kConnectRequest);
  // The receiver's point of view: its responder resources are the sender's initiator depth.
  EXPECT_EQ(ev.event->param.responder_resources, 4);
  EXPECT_EQ(ev.event->param.initiator_depth, 1);
  EXPECT_EQ(ev.event->param.retry_count, 6);
  EXPECT_EQ(ev.event->param.rnr_retry_count, 5);
  EXPECT_EQ(ev.event->param.qp_num, 0x11u);
  EXPECT_EQ(ev.event->private_data_len, 56);  // 92 - the 36-byte IP header
  EXPECT_EQ(std::memcmp(ev.event->private_data.data(), "hello", 5), 0);

  const uint8_t reply[] = {'w', 'o', 'r', 'l', 'd'};
  auto s2 = passive.accept(accept_args(reply));
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(passive.state(), ConnState::kRepSent);
  const RepMsg rep = std::get<RepMsg>(*s2->send);
  EXPECT_EQ(rep.local_comm_id, kPassiveComm);
  EXPECT_EQ(rep.remote_comm_id, kActiveComm);
  EXPECT_EQ(rep.local_qpn, 0x22u);
  EXPECT_EQ(rep.rnr_retry_count, 3);

  Step s3 = active.on_message(CmMessage(rep));
  EXPECT_EQ(active.state(), ConnState::kRepRcvd);
  ASSERT_TRUE(s3.event);
  EXPECT_EQ(s3.event->type, CmEventType::kConnectResponse);
  EXPECT_EQ(s3.event->private_data_len, 196);
  EXPECT_EQ(std::memcmp(s3.event->private_data.data(), "world", 5), 0);
  EXPECT_EQ(s3.event->param.qp_num, 0x22u);
  EXPECT_EQ(s3.event->param.responder_resources, 1);  // the passive initiator depth
  EXPECT_EQ(s3.event->param.initiator_depth, 4);      // the passive responder resources

  auto s4 = active.establish();
  ASSERT_TRUE(s4.has_value());
  EXPECT_EQ(active.state(), ConnState::kEstablished);
  ASSERT_TRUE(s4->send && std::holds_alternative<RtuMsg>(*s4->send));
  EXPECT_FALSE(s4->event);  // the active side's ESTABLISHED comes from CONNECT_RESPONSE

  Step s5 = passive.on_message(*s4->send);
  EXPECT_EQ(passive.state(), ConnState::kEstablished);
  ASSERT_TRUE(s5.event);
  EXPECT_EQ(s5.event->type, CmEventType::kEstablished);
  EXPECT_EQ(s5.event->private_data_len, 0);

  // What each QP gets.
  const Negotiated& a = active.negotiated();
  EXPECT_EQ(a.remote_qpn, 0x22u);
  EXPECT_EQ(a.remote_psn, 0x300u);  // the passive side's, chosen when the REQ came
  EXPECT_EQ(a.local_psn, 0x100u);
  EXPECT_EQ(a.retry_count, 6);
  EXPECT_EQ(a.rnr_retry_count, 3);  // from the REP
  const Negotiated& b = passive.negotiated();
  EXPECT_EQ(b.remote_qpn, 0x11u);
  EXPECT_EQ(b.remote_psn, 0x100u);
  EXPECT_EQ(b.local_psn, 0x300u);
  EXPECT_EQ(b.responder_resources, 4);
  EXPECT_EQ(b.initiator_depth, 1);
}

// rdma_accept moves the passive QP to RTR and RTS before the REP goes out.
// As Linux's ib_cm reads a CM message's Starting PSN (the PSN its sender
// will receive), the passive QP sends from the REQ's PSN and receives from
// the one its REP announces, and the active QP the other way round: each
// responder expects exactly what the other's requester sends.
TEST(CmConnection, EachQpReceivesFromThePsnItsOwnMessageAnnounces) {
  Connection active;
  auto s1 = active.connect(connect_args());
  ASSERT_TRUE(s1.has_value());
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*s1->send), kPassiveComm, 0x4567, path_from(1, 1), kIpHeaderSize, ev);
  const auto& req = std::get<ReqMsg>(*s1->send);
  auto rtr_before_rep = init_qp_attr(passive, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTR);
  auto rts_before_rep = init_qp_attr(passive, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS);
  ASSERT_TRUE(rtr_before_rep.has_value());
  ASSERT_TRUE(rts_before_rep.has_value());
  EXPECT_EQ(rts_before_rep->attr.sq_psn, req.starting_psn);  // cm_req_handler: sq_psn from the REQ
  auto s2 = passive.accept(accept_args());
  ASSERT_TRUE(s2.has_value());
  const auto& rep = std::get<RepMsg>(*s2->send);
  EXPECT_EQ(rep.starting_psn, 0x4567u);
  EXPECT_EQ(rep.starting_psn, rtr_before_rep->attr.rq_psn);
  active.on_message(*s2->send);
  // The active side: receives from its REQ's PSN, sends from the REP's.
  EXPECT_EQ(init_qp_attr(active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTR)->attr.rq_psn, req.starting_psn);
  EXPECT_EQ(init_qp_attr(active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS)->attr.sq_psn, rep.starting_psn);
}

// The local ACK timeout as Linux's ib_cm derives it: the REQ carries one
// for the path (packet lifetime and our CA's ACK delay), the passive QP
// takes it as it is, and the active QP recomputes it with the ACK delay the
// REP announces. (softhca sent 14, 67 ms: an rxe peer's QP then gave up on
// a softhca responder descheduled for half a second.)
TEST(CmConnection, AckTimeoutsAsLinuxDerivesThem) {
  Connection active;
  auto s1 = active.connect(connect_args());
  ASSERT_TRUE(s1.has_value());
  const auto& req = std::get<ReqMsg>(*s1->send);
  EXPECT_EQ(req.primary_local_ack_timeout, 17);
  Step ev;
  Connection passive = Connection::from_req(req, kPassiveComm, 0x300, path_from(1, 1), kIpHeaderSize, ev);
  auto s2 = passive.accept(accept_args());
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(init_qp_attr(passive, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS)->attr.timeout, 17);
  RepMsg rep = std::get<RepMsg>(*s2->send);
  EXPECT_EQ(rep.target_ack_delay, 15);
  rep.target_ack_delay = 20;  // a slow CA: its delay dominates
  active.on_message(CmMessage(rep));
  EXPECT_EQ(init_qp_attr(active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS)->attr.timeout, 20);
  // The kernel's values: 6.1's packet lifetime 18 gives 19; 6.2's 16, 17.
  EXPECT_EQ(cm_ack_timeout(15, 18), 19);
  EXPECT_EQ(cm_ack_timeout(15, 16), 17);
  EXPECT_EQ(cm_ack_timeout(16, 14), 17);  // close: one step more
  EXPECT_EQ(cm_ack_timeout(31, 31), 31);
}

// A REJ for a timeout, sent by an active side destroyed before the REP,
// names the connection by its own comm id and its CA GUID (the additional
// reject information, big-endian), which is how ib_cm finds it: it knows
// no comm id of ours yet.
TEST(CmConnection, ATimeoutRejCarriesTheActiveCaGuid) {
  Connection active;
  ConnectArgs args = connect_args();
  args.local_ca_guid = 0x0102030405060708;
  ASSERT_TRUE(active.connect(args).has_value());
  Step s = active.on_destroy();
  ASSERT_TRUE(s.send);
  const auto& rej = std::get<RejMsg>(*s.send);
  EXPECT_EQ(rej.reason, static_cast<uint16_t>(RejReason::kTimeout));
  EXPECT_EQ(rej.local_comm_id, kActiveComm);
  EXPECT_EQ(rej.remote_comm_id, 0u);
  ASSERT_EQ(rej.ari_length, 8);
  const uint8_t guid[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::memcmp(rej.ari.data(), guid, 8), 0);
}

TEST(CmConnection, QpAttributesFollowTheConnection) {
  Connection fresh;
  // Before any REQ: INIT without remote access, RTR/RTS impossible.
  auto init0 = init_qp_attr(fresh, IBV_QPT_RC, 1, 0, 0, IBV_QPS_INIT);
  ASSERT_TRUE(init0.has_value());
  EXPECT_EQ(init0->mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(init0->attr.qp_access_flags, 0u);
  EXPECT_EQ(init0->attr.port_num, 1);
  EXPECT_EQ(init_qp_attr(fresh, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTR).error(), std::errc::invalid_argument);
  EXPECT_EQ(init_qp_attr(fresh, IBV_QPT_RC, 1, 0, 0, IBV_QPS_SQD).error(), std::errc::invalid_argument);

  Pair p = handshake_to_rep();
  auto init = init_qp_attr(p.active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_INIT);
  EXPECT_EQ(init->attr.qp_access_flags,
            unsigned(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  auto rtr = init_qp_attr(p.active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTR);
  ASSERT_TRUE(rtr.has_value());
  EXPECT_EQ(rtr->mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(rtr->attr.dest_qp_num, 0x22u);
  EXPECT_EQ(rtr->attr.rq_psn, 0x100u);  // the REQ's own PSN (Negotiated)
  EXPECT_EQ(rtr->attr.path_mtu, IBV_MTU_4096);
  EXPECT_EQ(rtr->attr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr->attr.ah_attr.port_num, 1);
  EXPECT_EQ(rtr->attr.ah_attr.grh.dgid.raw[12], 127);
  EXPECT_EQ(rtr->attr.max_dest_rd_atomic, 1);  // what the passive side may read from us
  auto rts = init_qp_attr(p.active, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS);
  ASSERT_TRUE(rts.has_value());
  EXPECT_EQ(rts->mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC);
  EXPECT_EQ(rts->attr.sq_psn, 0x300u);  // the REP's PSN
  EXPECT_EQ(rts->attr.retry_cnt, 6);
  EXPECT_EQ(rts->attr.rnr_retry, 3);
  EXPECT_EQ(rts->attr.max_rd_atomic, 4);
  EXPECT_EQ(rts->attr.timeout, 17);  // cm_ack_timeout(the REP's ACK delay 15, the REQ's 17 - 1)

  auto prtr = init_qp_attr(p.passive, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTR);
  EXPECT_EQ(prtr->attr.dest_qp_num, 0x11u);
  EXPECT_EQ(prtr->attr.rq_psn, 0x300u);
  EXPECT_EQ(init_qp_attr(p.passive, IBV_QPT_RC, 1, 0, 0, IBV_QPS_RTS)->attr.sq_psn, 0x100u);

  // UD: Q_Key at INIT, bare RTR, RTS with PSN 0.
  auto ud = init_qp_attr(fresh, IBV_QPT_UD, 1, 0, 0x01234567, IBV_QPS_INIT);
  EXPECT_EQ(ud->mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  EXPECT_EQ(ud->attr.qkey, 0x01234567u);
  EXPECT_EQ(init_qp_attr(fresh, IBV_QPT_UD, 1, 0, 0, IBV_QPS_RTR)->mask, IBV_QP_STATE);
  EXPECT_EQ(init_qp_attr(fresh, IBV_QPT_UD, 1, 0, 0, IBV_QPS_RTS)->mask, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

TEST(CmConnection, RejectCarriesPrivateDataAndReason) {
  Connection active;
  auto s1 = active.connect(connect_args());
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*s1->send), kPassiveComm, 1, path_from(1, 1), kIpHeaderSize, ev);
  const uint8_t why[] = {'b', 'u', 's', 'y'};
  auto rej = passive.reject(why, static_cast<uint16_t>(RejReason::kConsumerDefined));
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(passive.state(), ConnState::kIdle);
  const RejMsg& m = std::get<RejMsg>(*rej->send);
  EXPECT_EQ(m.remote_comm_id, kActiveComm);
  EXPECT_EQ(m.message_rejected, RejectedMessage::kReq);

  Step got = active.on_message(*rej->send);
  EXPECT_EQ(active.state(), ConnState::kIdle);
  ASSERT_TRUE(got.event);
  EXPECT_EQ(got.event->type, CmEventType::kRejected);
  EXPECT_EQ(got.event->status, 28);
  EXPECT_EQ(got.event->private_data_len, 148);
  EXPECT_EQ(std::memcmp(got.event->private_data.data(), "busy", 4), 0);

  // A rejected id does not connect again (rdma_cm: EINVAL).
  EXPECT_EQ(active.connect(connect_args()).error(), std::errc::invalid_argument);
  // Too much private data.
  Connection other = Connection::from_req(std::get<ReqMsg>(*s1->send), 9, 1, path_from(1, 1), kIpHeaderSize, ev);
  std::array<uint8_t, 149> big{};
  EXPECT_EQ(other.reject(big, 28).error(), std::errc::invalid_argument);
  std::array<uint8_t, 197> bigger{};
  EXPECT_EQ(other.accept(accept_args(bigger)).error(), std::errc::invalid_argument);
}

TEST(CmConnection, DisconnectGivesOneDisconnectedEachSide) {
  Pair p = handshake_to_rep();
  auto rtu = p.active.establish();
  p.passive.on_message(*rtu->send);

  auto d = p.active.disconnect();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(p.active.state(), ConnState::kDreqSent);
  const DreqMsg& dreq = std::get<DreqMsg>(*d->send);
  EXPECT_EQ(dreq.remote_qpn, 0x22u);

  Step at_passive = p.passive.on_message(*d->send);
  EXPECT_EQ(p.passive.state(), ConnState::kTimewait);
  ASSERT_TRUE(at_passive.event && at_passive.send);
  EXPECT_EQ(at_passive.event->type, CmEventType::kDisconnected);
  EXPECT_TRUE(std::holds_alternative<DrepMsg>(*at_passive.send));

  Step at_active = p.active.on_message(*at_passive.send);
  EXPECT_EQ(p.active.state(), ConnState::kTimewait);
  ASSERT_TRUE(at_active.event);
  EXPECT_EQ(at_active.event->type, CmEventType::kDisconnected);

  // The passive side's own rdma_disconnect afterwards: nothing more.
  auto again = p.passive.disconnect();
  ASSERT_TRUE(again.has_value());
  EXPECT_FALSE(again->send);
  EXPECT_FALSE(again->event);
  // A duplicate DREQ in timewait is answered, with no second event.
  Step dup = p.passive.on_message(*d->send);
  EXPECT_TRUE(dup.send);
  EXPECT_FALSE(dup.event);
}

TEST(CmConnection, CrossingDisconnects) {
  Pair p = handshake_to_rep();
  p.passive.on_message(*p.active.establish()->send);
  auto da = p.active.disconnect();
  auto dp = p.passive.disconnect();
  Step a = p.active.on_message(*dp->send);   // DREQ in DREQ_SENT
  Step b = p.passive.on_message(*da->send);
  ASSERT_TRUE(a.event && b.event);
  EXPECT_EQ(a.event->type, CmEventType::kDisconnected);
  EXPECT_EQ(b.event->type, CmEventType::kDisconnected);
  // The DREPs then arrive in timewait: ignored.
  EXPECT_FALSE(p.active.on_message(*b.send).event);
  EXPECT_FALSE(p.passive.on_message(*a.send).event);
}

TEST(CmConnection, PeerLostInEveryState) {
  {
    Connection c;
    c.connect(connect_args());
    Step s = c.on_peer_lost();
    ASSERT_TRUE(s.event);
    EXPECT_EQ(s.event->type, CmEventType::kRejected);
    EXPECT_EQ(s.event->status, 28);
  }
  {
    Pair p = handshake_to_rep();
    Step s = p.passive.on_peer_lost();  // REP_SENT: the active end vanished
    EXPECT_EQ(s.event->type, CmEventType::kRejected);
    Step t = p.active.on_peer_lost();   // REP_RCVD
    EXPECT_EQ(t.event->type, CmEventType::kRejected);
  }
  {
    Step ev;
    Connection active;
    auto req = active.connect(connect_args());
    Connection passive = Connection::from_req(std::get<ReqMsg>(*req->send), 5, 1, path_from(1, 1), kIpHeaderSize, ev);
    Step s = passive.on_peer_lost();  // REQ_RCVD: the active end died in REQ_SENT
    EXPECT_EQ(s.event->type, CmEventType::kRejected);
    EXPECT_EQ(s.event->status, 4);  // timeout
  }
  {
    Pair p = handshake_to_rep();
    p.passive.on_message(*p.active.establish()->send);
    Step s = p.active.on_peer_lost();
    EXPECT_EQ(s.event->type, CmEventType::kDisconnected);
    EXPECT_EQ(p.active.state(), ConnState::kTimewait);
    EXPECT_FALSE(p.active.on_peer_lost().event);  // only once
  }
  EXPECT_FALSE(Connection().on_peer_lost().event);
}

TEST(CmConnection, DestroyTellsThePeerAsTheKernelDoes) {
  auto reason_of = [](const Step& s) { return std::get<RejMsg>(*s.send).reason; };
  {
    Connection c;
    c.connect(connect_args());
    EXPECT_EQ(reason_of(c.on_destroy()), 4);  // REQ_SENT: timeout
  }
  {
    Pair p = handshake_to_rep();
    EXPECT_EQ(reason_of(p.active.on_destroy()), 28);   // REP_RCVD
    EXPECT_EQ(reason_of(p.passive.on_destroy()), 28);  // REP_SENT
  }
  {
    Pair p = handshake_to_rep();
    p.passive.on_message(*p.active.establish()->send);
    Step s = p.active.on_destroy();
    ASSERT_TRUE(s.send);
    EXPECT_TRUE(std::holds_alternative<DreqMsg>(*s.send));
    EXPECT_EQ(p.active.state(), ConnState::kIdle);
  }
  EXPECT_FALSE(Connection().on_destroy().send);
}

TEST(CmConnection, WrongStatesAndStaleMessages) {
  Connection c;
  EXPECT_EQ(c.accept(accept_args()).error(), std::errc::invalid_argument);
  EXPECT_EQ(c.establish().error(), std::errc::invalid_argument);
  EXPECT_EQ(c.disconnect().error(), std::errc::invalid_argument);  // never connected
  EXPECT_EQ(c.reject({}, 28).error(), std::errc::invalid_argument);
  EXPECT_EQ(c.notify_established().error(), std::errc::invalid_argument);

  Pair p = handshake_to_rep();
  // A duplicate REP changes nothing.
  RepMsg rep;
  EXPECT_FALSE(p.active.on_message(CmMessage(rep)).event);
  // rdma_notify(COMM_EST) on the passive side stands in for a lost RTU.
  auto n = p.passive.notify_established();
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->event->type, CmEventType::kEstablished);
  EXPECT_EQ(p.passive.notify_established().error(), std::errc::already_connected);
  // An RTU after that is ignored.
  EXPECT_FALSE(p.passive.on_message(CmMessage(RtuMsg{})).event);
  // A DREP without a DREQ is ignored.
  EXPECT_FALSE(p.passive.on_message(CmMessage(DrepMsg{})).event);
}

TEST(CmConnection, SidrResolvesARemoteUdQp) {
  SidrArgs args;
  args.local_comm_id = kActiveComm;
  args.service_id = service_id(0x0111, 7174);
  args.path = path_from(1, 1);
  args.private_data[kIpHeaderSize] = 'u';
  Connection active;
  auto s1 = active.sidr_request(args);
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(active.state(), ConnState::kSidrReqSent);
  const SidrReqMsg req = std::get<SidrReqMsg>(*s1->send);
  EXPECT_EQ(req.request_id, kActiveComm);

  Step ev;
  Connection passive = Connection::from_sidr_req(req, kPassiveComm, path_from(1, 1), kIpHeaderSize, ev);
  EXPECT_EQ(passive.state(), ConnState::kSidrReqRcvd);
  ASSERT_TRUE(ev.event);
  EXPECT_EQ(ev.event->type, CmEventType::kConnectRequest);
  EXPECT_EQ(ev.event->private_data_len, 180);  // 216 - the IP header
  EXPECT_EQ(ev.event->private_data[0], 'u');

  const uint8_t pd[] = {'o', 'k'};
  auto s2 = passive.sidr_accept(0x33, 0x01234567, pd);
  ASSERT_TRUE(s2.has_value());
  const SidrRepMsg rep = std::get<SidrRepMsg>(*s2->send);
  EXPECT_EQ(rep.request_id, kActiveComm);
  EXPECT_EQ(rep.status, 0);
  EXPECT_EQ(rep.service_id, args.service_id);

  Step s3 = active.on_message(*s2->send);
  ASSERT_TRUE(s3.event);
  EXPECT_EQ(s3.event->type, CmEventType::kEstablished);
  EXPECT_EQ(s3.event->param.qp_num, 0x33u);
  EXPECT_EQ(s3.event->qkey, 0x01234567u);
  EXPECT_EQ(s3.event->private_data_len, 136);
  EXPECT_EQ(s3.event->private_data[0], 'o');
  EXPECT_FALSE(active.on_message(*s2->send).event);  // a duplicate

  // Rejected, or nobody there: UNREACHABLE with the SIDR status.
  Connection a2;
  auto r1 = a2.sidr_request(args);
  Connection p2 = Connection::from_sidr_req(std::get<SidrReqMsg>(*r1->send), 7, path_from(1, 1), kIpHeaderSize, ev);
  auto rej = p2.reject({}, 28);
  ASSERT_TRUE(rej.has_value());
  Step s4 = a2.on_message(*rej->send);
  EXPECT_EQ(s4.event->type, CmEventType::kUnreachable);
  EXPECT_EQ(s4.event->status, 2);
  Connection a3;
  a3.sidr_request(args);
  EXPECT_EQ(a3.on_peer_lost().event->type, CmEventType::kUnreachable);
  Connection p3 = Connection::from_sidr_req(std::get<SidrReqMsg>(*r1->send), 8, path_from(1, 1), kIpHeaderSize, ev);
  EXPECT_EQ(std::get<SidrRepMsg>(*p3.on_destroy().send).status, 2);
}

}  // namespace
}  // namespace softhca::cm

namespace softhca::cm {
namespace {

// A process that exits right after a DREQ came may not have sent its DREP
// yet: at exit the DREP goes once more; an established id sends its DREQ.
TEST(CmConnectionExit, TimewaitRepeatsItsDrepAndEstablishedSendsADreq) {
  Pair p = handshake_to_rep();
  auto rtu = p.active.establish();
  ASSERT_TRUE(rtu.has_value() && rtu->send);
  p.passive.on_message(*rtu->send);
  ASSERT_EQ(p.passive.state(), ConnState::kEstablished);
  auto dreq = p.active.disconnect();
  ASSERT_TRUE(dreq.has_value() && dreq->send);
  Step answered = p.passive.on_message(*dreq->send);
  ASSERT_EQ(p.passive.state(), ConnState::kTimewait);
  Step at_exit = p.passive.on_exit();
  ASSERT_TRUE(at_exit.send && std::holds_alternative<DrepMsg>(*at_exit.send));
  EXPECT_EQ(std::get<DrepMsg>(*at_exit.send), std::get<DrepMsg>(*answered.send));
  EXPECT_FALSE(at_exit.event);

  Pair q = handshake_to_rep();
  auto rtu2 = q.active.establish();
  ASSERT_TRUE(rtu2.has_value());
  Step exit_established = q.active.on_exit();
  ASSERT_TRUE(exit_established.send);
  EXPECT_TRUE(std::holds_alternative<DreqMsg>(*exit_established.send));
}

}  // namespace
}  // namespace softhca::cm
