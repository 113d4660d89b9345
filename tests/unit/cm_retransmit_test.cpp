// Retransmission and timeouts in the connection state machine
// (cm/connection.hpp): which message is sent again and when, how an MRA
// stretches the wait, and what each side reports when its retries run out —
// the kernel ib_cm's behaviour under rdma_cm, with the timer driven by hand.
#include <gtest/gtest.h>

#include <cerrno>

#include "cm/connection.hpp"

namespace softhca::cm {
namespace {

constexpr uint32_t kActiveComm = 0x1000;
constexpr uint32_t kPassiveComm = 0x2000;

ConnectArgs connect_args(CmTimeouts t) {
  ConnectArgs a;
  a.local_comm_id = kActiveComm;
  a.service_id = service_id(0x0106, 7174);
  a.qpn = 0x11;
  a.starting_psn = 0x100;
  a.timeouts = t;
  return a;
}

AcceptArgs accept_args() {
  AcceptArgs a;
  a.qpn = 0x22;
  return a;
}

// Fires the current wait's timer and returns what the connection does.
Step expire(Connection& c) {
  const auto wait = c.retransmit();
  EXPECT_TRUE(wait.has_value());
  return wait ? c.on_timeout(wait->generation) : Step{};
}

struct Established {
  Connection active;
  Connection passive;
};

Established establish(CmTimeouts t) {
  Established e;
  auto req = e.active.connect(connect_args(t));
  Step ev;
  e.passive = Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
  auto rep = e.passive.accept(accept_args());
  e.active.on_message(*rep->send);
  auto rtu = e.active.establish();
  e.passive.on_message(*rtu->send);
  EXPECT_EQ(e.active.state(), ConnState::kEstablished);
  EXPECT_EQ(e.passive.state(), ConnState::kEstablished);
  return e;
}

// What goes on being sent once an id is destroyed, or its process exits
// (the service keeps sending it to a peer on another host until the DREP
// comes): the DREQ of a connection that is established, waits for its RTU,
// or waits for its DREQ's DREP, with the retries that wait has left; nothing
// in the handshake (a REJ, once, ends that) or once disconnected.
TEST(CmRetransmit, AConnectionOutlivesItsIdUntilItsDreqIsAnswered) {
  {
    Established e = establish(CmTimeouts{8, 3});
    const auto d = e.active.departure();
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->dreq.local_comm_id, kActiveComm);
    EXPECT_EQ(d->dreq.remote_comm_id, kPassiveComm);
    EXPECT_EQ(d->dreq.remote_qpn, 0x22u);
    EXPECT_EQ(d->retries, 3);
    EXPECT_GT(d->wait_ms, 0u);
    EXPECT_TRUE(std::holds_alternative<DreqMsg>(*e.active.on_destroy().send)) << "the first DREQ";
  }
  {
    // Disconnecting, one DREQ already sent again: two retries are left.
    Established e = establish(CmTimeouts{8, 3});
    auto dreq = e.passive.disconnect();
    ASSERT_TRUE(dreq && dreq->send);
    expire(e.passive);
    const auto d = e.passive.departure();
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->dreq.local_comm_id, kPassiveComm);
    EXPECT_EQ(d->retries, 2);
    EXPECT_FALSE(e.passive.on_destroy().send) << "the DREQ went already; the departure sends it again";
  }
  {
    // The passive side waits for the RTU (lost): its peer may be connected.
    Connection active;
    auto req = active.connect(connect_args(CmTimeouts{8, 3}));
    Step ev;
    Connection passive =
        Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
    ASSERT_TRUE(passive.accept(accept_args()));
    ASSERT_EQ(passive.state(), ConnState::kRepSent);
    ASSERT_TRUE(passive.departure().has_value());
    EXPECT_FALSE(active.departure().has_value()) << "REQ_SENT: a REJ ends it";
  }
  {
    Established e = establish(CmTimeouts{8, 3});
    auto dreq = e.active.disconnect();
    e.active.on_message(*e.passive.on_message(*dreq->send).send);  // the DREP
    EXPECT_EQ(e.active.state(), ConnState::kTimewait);
    EXPECT_FALSE(e.active.departure().has_value());
    EXPECT_FALSE(e.passive.departure().has_value());
  }
  EXPECT_FALSE(Connection().departure().has_value());
}

TEST(CmRetransmit, IbaTimesInMillisecondsAsTheKernelRoundsThem) {
  EXPECT_EQ(iba_time_ms(0), 1u);
  EXPECT_EQ(iba_time_ms(8), 1u);
  EXPECT_EQ(iba_time_ms(9), 2u);
  EXPECT_EQ(iba_time_ms(16), 256u);
  EXPECT_EQ(iba_time_ms(20), 4096u);
  EXPECT_EQ(iba_time_ms(24), 65536u);
  EXPECT_EQ(iba_time_ms(31), 1u << 23);
}

TEST(CmRetransmit, ReqCarriesTheTimeoutsAndTheActiveSideWaitsTwoLifetimesMore) {
  Connection active;
  auto s = active.connect(connect_args(CmTimeouts{}));
  ASSERT_TRUE(s.has_value());
  const ReqMsg& req = std::get<ReqMsg>(*s->send);
  EXPECT_EQ(req.remote_cm_response_timeout, 20);  // rdma_cm's defaults
  EXPECT_EQ(req.local_cm_response_timeout, 20);
  EXPECT_EQ(req.max_cm_retries, 15);
  auto wait = active.retransmit();
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(wait->timeout_ms, 2 * 256u + 4096u);
}

TEST(CmRetransmit, UnansweredReqIsSentAgainThenUnreachable) {
  Connection active;
  auto s = active.connect(connect_args(CmTimeouts{8, 2}));
  const ReqMsg first = std::get<ReqMsg>(*s->send);
  for (int retry = 0; retry < 2; ++retry) {
    const auto wait = active.retransmit();
    ASSERT_TRUE(wait.has_value());
    EXPECT_EQ(wait->timeout_ms, 2 * 256u + 1u);
    Step again = active.on_timeout(wait->generation);
    ASSERT_TRUE(again.send) << "retry " << retry;
    EXPECT_EQ(std::get<ReqMsg>(*again.send), first);
    EXPECT_FALSE(again.event);
    EXPECT_EQ(active.state(), ConnState::kReqSent);
    // The timer of the wait just ended is stale now.
    EXPECT_FALSE(active.on_timeout(wait->generation).send);
  }
  Step gave_up = expire(active);
  EXPECT_FALSE(gave_up.send);
  ASSERT_TRUE(gave_up.event);
  EXPECT_EQ(gave_up.event->type, CmEventType::kUnreachable);
  EXPECT_EQ(gave_up.event->status, -ETIMEDOUT);
  EXPECT_EQ(active.state(), ConnState::kIdle);
  EXPECT_FALSE(active.retransmit().has_value());
}

TEST(CmRetransmit, AnAnswerEndsTheWait) {
  Connection active;
  auto req = active.connect(connect_args(CmTimeouts{8, 2}));
  const auto wait = active.retransmit();
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
  active.on_message(*passive.accept(accept_args())->send);
  EXPECT_EQ(active.state(), ConnState::kRepRcvd);
  EXPECT_FALSE(active.retransmit().has_value());
  Step late = active.on_timeout(wait->generation);
  EXPECT_FALSE(late.send);
  EXPECT_FALSE(late.event);
}

TEST(CmRetransmit, PassiveSideSendsAnMraThatStretchesTheActiveWait) {
  Connection active;
  auto req = active.connect(connect_args(CmTimeouts{8, 3}));
  const auto before = active.retransmit();
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
  ASSERT_TRUE(ev.event);
  ASSERT_TRUE(ev.send);
  const MraMsg& mra = std::get<MraMsg>(*ev.send);
  EXPECT_EQ(mra.local_comm_id, kPassiveComm);
  EXPECT_EQ(mra.remote_comm_id, kActiveComm);
  EXPECT_EQ(mra.message_mraed, MraedMessage::kReq);
  EXPECT_EQ(mra.service_timeout, kMraServiceTimeout);

  EXPECT_FALSE(active.on_message(*ev.send).event);
  EXPECT_EQ(active.state(), ConnState::kReqSent);
  const auto after = active.retransmit();
  ASSERT_TRUE(after.has_value());
  EXPECT_NE(after->generation, before->generation);
  EXPECT_EQ(after->timeout_ms, 65536u + 256u);
  EXPECT_FALSE(active.on_timeout(before->generation).send);  // the old timer is void

  // The REQ still goes out again when the stretched wait ends; the passive
  // side, still waiting for its application, answers the duplicate with an MRA.
  Step again = expire(active);
  ASSERT_TRUE(again.send);
  EXPECT_TRUE(std::holds_alternative<ReqMsg>(*again.send));
  Step dup = passive.on_duplicate_req();
  ASSERT_TRUE(dup.send);
  EXPECT_EQ(std::get<MraMsg>(*dup.send), mra);
  EXPECT_FALSE(dup.event);
  // Once the application accepted, duplicates are left to the REP's own timer.
  passive.accept(accept_args());
  EXPECT_FALSE(passive.on_duplicate_req().send);
}

TEST(CmRetransmit, UnansweredRepIsSentAgainThenUnreachableInTimewait) {
  Connection active;
  auto req = active.connect(connect_args(CmTimeouts{12, 1}));
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
  auto rep = passive.accept(accept_args());
  const RepMsg first = std::get<RepMsg>(*rep->send);
  // The passive side waits for the RTU as long as the REQ's local response time.
  ASSERT_TRUE(passive.retransmit().has_value());
  EXPECT_EQ(passive.retransmit()->timeout_ms, 16u);
  Step again = expire(passive);
  ASSERT_TRUE(again.send);
  EXPECT_EQ(std::get<RepMsg>(*again.send), first);
  Step gave_up = expire(passive);
  ASSERT_TRUE(gave_up.event);
  EXPECT_EQ(gave_up.event->type, CmEventType::kUnreachable);
  EXPECT_EQ(gave_up.event->status, -ETIMEDOUT);
  EXPECT_EQ(passive.state(), ConnState::kTimewait);
  // An RTU that comes after that establishes nothing.
  active.on_message(first);
  auto rtu = active.establish();
  EXPECT_FALSE(passive.on_message(*rtu->send).event);
}

TEST(CmRetransmit, DuplicateRepAfterEstablishingGetsTheRtuAgain) {
  Connection active;
  auto req = active.connect(connect_args(CmTimeouts{}));
  Step ev;
  Connection passive =
      Connection::from_req(std::get<ReqMsg>(*req->send), kPassiveComm, 0x300, PathInfo{}, kIpHeaderSize, ev);
  auto rep = passive.accept(accept_args());
  active.on_message(*rep->send);
  auto rtu = active.establish();
  Step dup = active.on_message(*rep->send);
  ASSERT_TRUE(dup.send);
  EXPECT_EQ(std::get<RtuMsg>(*dup.send), std::get<RtuMsg>(*rtu->send));
  EXPECT_FALSE(dup.event);
}

TEST(CmRetransmit, UnansweredDreqEndsInDisconnectedWithTimeout) {
  Established e = establish(CmTimeouts{10, 1});
  auto d = e.active.disconnect();
  ASSERT_TRUE(d.has_value());
  ASSERT_TRUE(e.active.retransmit().has_value());
  EXPECT_EQ(e.active.retransmit()->timeout_ms, 2 * 256u + 4u);
  Step again = expire(e.active);
  ASSERT_TRUE(again.send);
  EXPECT_EQ(std::get<DreqMsg>(*again.send), std::get<DreqMsg>(*d->send));
  Step gave_up = expire(e.active);
  ASSERT_TRUE(gave_up.event);
  EXPECT_EQ(gave_up.event->type, CmEventType::kDisconnected);
  EXPECT_EQ(gave_up.event->status, -ETIMEDOUT);
  EXPECT_EQ(e.active.state(), ConnState::kTimewait);
  EXPECT_FALSE(e.active.retransmit().has_value());

  // The passive side's DREQ waits its own (the REQ's local) response time.
  auto pd = e.passive.disconnect();
  ASSERT_TRUE(pd.has_value());
  ASSERT_TRUE(e.passive.retransmit().has_value());
  EXPECT_EQ(e.passive.retransmit()->timeout_ms, 4u);
  // A DREP ends the wait with a plain DISCONNECTED.
  Step drep = e.active.on_message(*pd->send);
  ASSERT_TRUE(drep.send);
  Step done = e.passive.on_message(*drep.send);
  ASSERT_TRUE(done.event);
  EXPECT_EQ(done.event->status, 0);
  EXPECT_FALSE(e.passive.retransmit().has_value());
}

TEST(CmRetransmit, UnansweredSidrReqIsUnreachable) {
  SidrArgs args;
  args.local_comm_id = kActiveComm;
  args.service_id = service_id(0x0111, 7174);
  args.timeouts = CmTimeouts{9, 0};
  Connection active;
  auto s = active.sidr_request(args);
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(active.retransmit().has_value());
  EXPECT_EQ(active.retransmit()->timeout_ms, 2u);  // the response time alone
  Step gave_up = expire(active);
  ASSERT_TRUE(gave_up.event);
  EXPECT_EQ(gave_up.event->type, CmEventType::kUnreachable);
  EXPECT_EQ(gave_up.event->status, -ETIMEDOUT);
  EXPECT_EQ(active.state(), ConnState::kIdle);
}

}  // namespace
}  // namespace softhca::cm
