// librdmacm's API on softhca, as an application sees it (the public header
// and our librdmacm.so.1): events and their values, private data in REQ, REP
// and REJ, connecting to nobody, nonblocking channels, bind errors,
// destroying ids with events outstanding, multicast joins on UDP ids, and
// peers that are killed in the
// middle of a handshake or while connected (cm_peer, a separate process).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <dirent.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "cm_test_support.hpp"

namespace {

using namespace cm_test;

class CmApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ch_ = rdma_create_event_channel();
    ASSERT_NE(ch_, nullptr);
  }
  void TearDown() override { rdma_destroy_event_channel(ch_); }

  // A listener on 127.0.0.1 with an ephemeral port.
  rdma_cm_id* listen_any(uint16_t& port) {
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(ch_, &id, this, RDMA_PS_TCP), 0);
    sockaddr_in sin = loopback(0);
    EXPECT_EQ(rdma_bind_addr(id, sa(sin)), 0);
    EXPECT_EQ(rdma_listen(id, 8), 0);
    port = ntohs(rdma_get_src_port(id));
    return id;
  }

  rdma_cm_id* resolved(uint16_t port) { return resolved_id(ch_, port); }

  rdma_event_channel* ch_ = nullptr;
};

TEST_F(CmApi, RequestCarriesPrivateDataAndRejectSendsItBack) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  ASSERT_GE(port, 32768);
  rdma_cm_id* client = resolved(port);

  rdma_conn_param param{};
  param.private_data = "hello";
  param.private_data_len = 6;
  param.qp_num = 0x4242;  // no QP on the id: the application names one
  param.responder_resources = 2;
  param.initiator_depth = 3;
  param.retry_count = 5;
  param.rnr_retry_count = 6;
  ASSERT_EQ(rdma_connect(client, &param), 0);

  rdma_cm_event* req = expect_event(ch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->listen_id, listener);
  EXPECT_NE(req->id, listener);
  EXPECT_EQ(req->id->context, this);  // a new id inherits its listener's context
  EXPECT_EQ(req->id->channel, ch_);
  EXPECT_NE(req->id->verbs, nullptr);
  EXPECT_EQ(req->param.conn.private_data_len, 56);
  EXPECT_STREQ(static_cast<const char*>(req->param.conn.private_data), "hello");
  EXPECT_EQ(req->param.conn.qp_num, 0x4242u);
  EXPECT_EQ(req->param.conn.responder_resources, 3);  // the requester's initiator depth
  EXPECT_EQ(req->param.conn.initiator_depth, 2);
  EXPECT_EQ(req->param.conn.retry_count, 5);
  EXPECT_EQ(req->param.conn.rnr_retry_count, 6);
  EXPECT_EQ(rdma_get_dst_port(req->id), rdma_get_src_port(client));
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);

  ASSERT_EQ(rdma_reject(child, "nope", 5), 0);
  rdma_cm_event* rej = expect_event(ch_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->id, client);
  EXPECT_EQ(rej->status, 28);  // IB_CM_REJ_CONSUMER_DEFINED
  EXPECT_EQ(rej->param.conn.private_data_len, 148);
  EXPECT_STREQ(static_cast<const char*>(rej->param.conn.private_data), "nope");
  rdma_ack_cm_event(rej);

  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(CmApi, ConnectAcceptEstablishDisconnectWithoutQps) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  rdma_cm_id* client = resolved(port);
  rdma_conn_param param{};
  param.qp_num = 0x77;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  rdma_cm_event* req = expect_event(ch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);

  EXPECT_EQ(rdma_accept(child, nullptr), -1);  // RC without a QP needs conn_param
  EXPECT_EQ(errno, EINVAL);
  rdma_conn_param acc{};
  acc.qp_num = 0x88;
  acc.private_data = "welcome";
  acc.private_data_len = 8;
  ASSERT_EQ(rdma_accept(child, &acc), 0);

  rdma_cm_event* resp = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(resp, nullptr);
  EXPECT_EQ(resp->id, client);
  EXPECT_EQ(resp->param.conn.private_data_len, 196);
  EXPECT_STREQ(static_cast<const char*>(resp->param.conn.private_data), "welcome");
  EXPECT_EQ(resp->param.conn.qp_num, 0x88u);
  rdma_ack_cm_event(resp);

  // The QP was created by hand: rdma_init_qp_attr gives its RTR values.
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(rdma_init_qp_attr(client, &attr, &mask), 0);
  EXPECT_EQ(attr.dest_qp_num, 0x88u);
  EXPECT_TRUE(mask & IBV_QP_DEST_QPN);
  ASSERT_EQ(rdma_establish(client), 0);
  rdma_cm_event* est = expect_event(ch_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(est, nullptr);
  EXPECT_EQ(est->id, child);
  rdma_ack_cm_event(est);

  ASSERT_EQ(rdma_disconnect(client), 0);
  int disconnected = 0, timewait = 0;
  for (int i = 0; i < 4; ++i) {
    rdma_cm_event* ev = wait_event(ch_, 3000);
    ASSERT_NE(ev, nullptr) << "after " << disconnected << " DISCONNECTED, " << timewait << " TIMEWAIT_EXIT";
    if (ev->event == RDMA_CM_EVENT_DISCONNECTED) ++disconnected;
    if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT) ++timewait;
    EXPECT_TRUE(ev->id == client || ev->id == child);
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(disconnected, 2);
  EXPECT_EQ(timewait, 2);
  EXPECT_EQ(rdma_disconnect(child), 0);  // after the peer's DREQ: nothing more to do

  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(CmApi, ConnectingToNobodyIsRejectedWithInvalidServiceId) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  ASSERT_EQ(rdma_destroy_id(listener), 0);  // the port is free again
  rdma_cm_id* client = resolved(port);
  rdma_conn_param param{};
  param.qp_num = 1;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  rdma_cm_event* rej = expect_event(ch_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->status, 8);  // IB_CM_REJ_INVALID_SERVICE_ID, as rping prints it
  rdma_ack_cm_event(rej);
  EXPECT_EQ(rdma_connect(client, &param), -1);  // a rejected id does not connect again
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

// A listener's backlog is the number of connection requests it may have
// waiting to be retrieved (rdma_get_cm_event). At exactly the backlog the next
// request is rejected with IB_CM_REJ_NO_RESOURCES (3); once one is retrieved,
// there is room again.
TEST_F(CmApi, FullBacklogRejectsWithNoResources) {
  rdma_event_channel* lch = rdma_create_event_channel();
  ASSERT_NE(lch, nullptr);
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_id(lch, &listener, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in sin = loopback(0);
  ASSERT_EQ(rdma_bind_addr(listener, sa(sin)), 0);
  ASSERT_EQ(rdma_listen(listener, 2), 0);
  const uint16_t port = ntohs(rdma_get_src_port(listener));
  rdma_conn_param param{};
  param.qp_num = 0x42;
  // The CM handles one process's requests in the order they were sent.
  rdma_cm_id* clients[4] = {};
  for (int i = 0; i < 3; ++i) {
    clients[i] = resolved(port);
    ASSERT_EQ(rdma_connect(clients[i], &param), 0);
  }
  rdma_cm_event* rej = expect_event(ch_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->id, clients[2]) << "the third request, one past the backlog, is the one rejected";
  EXPECT_EQ(rej->status, 3);  // IB_CM_REJ_NO_RESOURCES
  rdma_ack_cm_event(rej);
  rdma_cm_event* first = expect_event(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(first, nullptr);
  rdma_cm_id* first_child = first->id;
  rdma_ack_cm_event(first);
  // One retrieved: a new request fits again (its CONNECT_REQUEST arrives).
  clients[3] = resolved(port);
  ASSERT_EQ(rdma_connect(clients[3], &param), 0);
  rdma_cm_id* children[2] = {};
  for (auto& child : children) {
    rdma_cm_event* req = expect_event(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req, nullptr);
    child = req->id;
    rdma_ack_cm_event(req);
  }
  for (rdma_cm_id* child : {first_child, children[0], children[1]}) {
    EXPECT_EQ(rdma_reject(child, nullptr, 0), 0);
    EXPECT_EQ(rdma_destroy_id(child), 0);
  }
  for (rdma_cm_id* client : clients) EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
  rdma_destroy_event_channel(lch);
}

TEST_F(CmApi, SynchronousIdsReturnAfterTheirEvent) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_NE(id->channel, nullptr);
  sockaddr_in dst = loopback(1);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);  // default PD, CQs and channels made for us
  ASSERT_NE(id->qp, nullptr);
  EXPECT_NE(id->send_cq, nullptr);
  EXPECT_NE(id->recv_cq_channel, nullptr);
  EXPECT_EQ(id->qp->state, IBV_QPS_INIT);
  EXPECT_EQ(rdma_connect(id, nullptr), -1);  // nobody listens on port 1
  EXPECT_EQ(errno, ECONNREFUSED);
  rdma_destroy_qp(id);
  EXPECT_EQ(id->qp, nullptr);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// Two UDP ids bound to 127.0.0.1 join 239.1.1.7: MULTICAST_JOIN carries the
// group as librdmacm reports it over RoCE (MGID ::ffff:239.1.1.7, QPN 0xFFFFFF,
// RDMA_UDP_QKEY, the join's context), each id's QP is attached, a send to the
// group reaches the other id's QP, and leaving detaches.
TEST_F(CmApi, MulticastJoinSendLeave) {
  sockaddr_in group{};
  group.sin_family = AF_INET;
  group.sin_addr.s_addr = htonl(0xEF010107);  // 239.1.1.7
  rdma_cm_id* ids[2] = {};
  int contexts[2] = {};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(rdma_create_id(ch_, &ids[i], nullptr, RDMA_PS_UDP), 0);
    EXPECT_EQ(rdma_join_multicast(ids[i], sa(group), &contexts[i]), -1) << "not bound to the device yet";
    EXPECT_EQ(errno, EINVAL);
    sockaddr_in local = loopback(0);
    ASSERT_EQ(rdma_bind_addr(ids[i], sa(local)), 0);
    ibv_qp_init_attr attr{};
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = 16;
    attr.qp_type = IBV_QPT_UD;
    ASSERT_EQ(rdma_create_qp(ids[i], nullptr, &attr), 0);
    sockaddr_in unicast = loopback(0);
    EXPECT_EQ(rdma_join_multicast(ids[i], sa(unicast), nullptr), -1) << "127.0.0.1 is no group";
    EXPECT_EQ(errno, EINVAL);
    ASSERT_EQ(rdma_join_multicast(ids[i], sa(group), &contexts[i]), 0);
  }
  rdma_ud_param joined{};
  for (int i = 0; i < 2; ++i) {
    rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_MULTICAST_JOIN);
    ASSERT_NE(ev, nullptr);
    EXPECT_EQ(ev->status, 0);
    EXPECT_EQ(ev->id, ids[i]);
    EXPECT_EQ(ev->param.ud.private_data, &contexts[i]);
    EXPECT_EQ(ev->param.ud.qp_num, 0xFFFFFFu);
    EXPECT_EQ(ev->param.ud.qkey, uint32_t{RDMA_UDP_QKEY});
    EXPECT_EQ(ev->param.ud.ah_attr.is_global, 1);
    const uint8_t mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 7};
    EXPECT_EQ(std::memcmp(ev->param.ud.ah_attr.grh.dgid.raw, mgid, 16), 0);
    if (i == 0) joined = ev->param.ud;
    rdma_ack_cm_event(ev);
  }

  // ids[1] receives what ids[0] sends to the group (ids[0] posts no receive).
  char buf[40 + 16] = {};
  ibv_mr* mr = ibv_reg_mr(ids[1]->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge rsge{reinterpret_cast<uint64_t>(buf), sizeof buf, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_recv = nullptr;
  ASSERT_EQ(ibv_post_recv(ids[1]->qp, &rwr, &bad_recv), 0);
  ibv_ah* ah = ibv_create_ah(ids[0]->pd, &joined.ah_attr);
  ASSERT_NE(ah, nullptr);
  char msg[16] = "to the group";
  ibv_sge ssge{reinterpret_cast<uint64_t>(msg), sizeof msg, 0};
  ibv_send_wr swr{};
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = joined.qp_num;
  swr.wr.ud.remote_qkey = joined.qkey;
  ibv_send_wr* bad_send = nullptr;
  ASSERT_EQ(ibv_post_send(ids[0]->qp, &swr, &bad_send), 0);
  ibv_wc wc{};
  int got = 0;
  for (int spin = 0; spin < 5000 && got == 0; ++spin) {
    got = ibv_poll_cq(ids[1]->recv_cq, 1, &wc);
    if (got == 0) usleep(1000);
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.src_qp, ids[0]->qp->qp_num);
  EXPECT_EQ(std::memcmp(buf + 40, msg, sizeof msg), 0);
  ibv_destroy_ah(ah);
  ibv_dereg_mr(mr);

  for (rdma_cm_id* id : ids) {
    EXPECT_EQ(rdma_leave_multicast(id, sa(group)), 0);
    EXPECT_EQ(rdma_leave_multicast(id, sa(group)), -1) << "left already";
    EXPECT_EQ(errno, EADDRNOTAVAIL);
    ibv_gid mgid;
    std::memcpy(mgid.raw, joined.ah_attr.grh.dgid.raw, 16);
    EXPECT_EQ(ibv_detach_mcast(id->qp, &mgid, 0), EINVAL) << "the leave detached the QP";
    rdma_destroy_qp(id);
    EXPECT_EQ(rdma_destroy_id(id), 0);
  }
}

TEST_F(CmApi, NonblockingChannelAndPollableFd) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  const int flags = fcntl(ch_->fd, F_GETFL);
  ASSERT_EQ(fcntl(ch_->fd, F_SETFL, flags | O_NONBLOCK), 0);
  rdma_cm_event* ev = nullptr;
  EXPECT_EQ(rdma_get_cm_event(ch_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd p{ch_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  sockaddr_in dst = loopback(1);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  EXPECT_EQ(poll(&p, 1, 1000), 1);
  ASSERT_EQ(rdma_get_cm_event(ch_, &ev), 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(poll(&p, 1, 0), 0);  // drained
  EXPECT_EQ(rdma_destroy_id(id), 0);
  fcntl(ch_->fd, F_SETFL, flags);
}

TEST_F(CmApi, AckTimeoutAndTosOptionsReachTheQps) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &client, nullptr, RDMA_PS_TCP), 0);
  uint8_t tos = 32;
  ASSERT_EQ(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos), 0);
  sockaddr_in dst = loopback(port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, sa(dst), 2000), 0);
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  ASSERT_NE(client->route.path_rec, nullptr);
  EXPECT_EQ(client->route.path_rec->traffic_class, 32);
  uint8_t ack_timeout = 21;
  ASSERT_EQ(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout, 1), 0);
  EXPECT_EQ(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout, 4), -1);
  EXPECT_EQ(errno, EINVAL);

  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0);
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_create_qp(child, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(child, &param), 0);
  for (int i = 0; i < 2; ++i) {
    ev = expect_event(ch_, RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_NE(ev, nullptr);
    rdma_ack_cm_event(ev);
  }

  // The option's timeout on the side that set it, the path's on the other;
  // the type of service as the traffic class of both (the REQ carries it).
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(client->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_AV, &qi), 0);
  EXPECT_EQ(qa.timeout, 21);
  EXPECT_EQ(qa.ah_attr.grh.traffic_class, 32);
  ASSERT_EQ(ibv_query_qp(child->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_AV, &qi), 0);
  EXPECT_EQ(qa.timeout, 17);  // the REQ's, as ib_cm computes it (cm/connection.hpp cm_ack_timeout)
  EXPECT_EQ(qa.ah_attr.grh.traffic_class, 32);

  // Only RC ids have an ACK timeout.
  rdma_cm_id* ud = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &ud, nullptr, RDMA_PS_UDP), 0);
  errno = 0;
  EXPECT_EQ(rdma_set_option(ud, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout, 1), -1);
  EXPECT_EQ(errno, EINVAL);

  rdma_destroy_qp(client);
  rdma_destroy_qp(child);
  EXPECT_EQ(rdma_destroy_id(ud), 0);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(CmApi, AddressErrors) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in same = loopback(port);
  EXPECT_EQ(rdma_bind_addr(id, sa(same)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  sockaddr_in foreign = loopback(0);
  inet_pton(AF_INET, "192.0.2.123", &foreign.sin_addr);  // TEST-NET-1: not ours
  EXPECT_EQ(rdma_bind_addr(id, sa(foreign)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(rdma_bind_addr(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_resolve_route(id, 100), -1);  // no address yet
  EXPECT_EQ(errno, EINVAL);

  // Another host's address is not resolved here: that needs the kernel's
  // neighbour table, and asking it to resolve the machine's gateway would
  // send a datagram onto whatever network runs this test. The system tests
  // two_hosts.cm.* resolve between network namespaces they make: rping and
  // the others (ADDR_RESOLVED), addr_error_no_neighbour (ADDR_ERROR
  // -ETIMEDOUT), addr_pending_destroy (EINVAL while resolving, destroy
  // mid-way).
  EXPECT_EQ(rdma_destroy_id(id), 0);

  rdma_cm_id* client = resolved(port);
  char big[57] = {};
  rdma_conn_param param{};
  param.qp_num = 1;
  param.private_data = big;
  param.private_data_len = sizeof big;  // one more than a REQ carries after the IP header
  EXPECT_EQ(rdma_connect(client, &param), -1);
  EXPECT_EQ(errno, EINVAL);
  param.responder_resources = 200;  // more than the device has
  param.private_data_len = 0;
  EXPECT_EQ(rdma_connect(client, &param), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(CmApi, DestroyWithEventsOutstanding) {
  // An undelivered event is dropped with its id.
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = loopback(1);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  pollfd p{ch_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 100), 0);

  // A listener destroyed with a request not yet handed out rejects it.
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);
  rdma_cm_id* client = resolved(port);
  rdma_conn_param param{};
  param.qp_num = 1;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  for (int i = 0; i < 100 && poll(&p, 1, 10) == 0; ++i) {
  }
  EXPECT_EQ(rdma_destroy_id(listener), 0);  // the CONNECT_REQUEST goes with it
  rdma_cm_event* rej = expect_event(ch_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->id, client);
  EXPECT_EQ(rej->status, 28);
  rdma_ack_cm_event(rej);
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST(CmAddrinfo, PassiveWildcardAndNumericHosts) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, "7471", &hints, &res), 0);
  ASSERT_NE(res->ai_src_addr, nullptr);
  EXPECT_EQ(res->ai_flags & RAI_PASSIVE, RAI_PASSIVE);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  const auto* sin = reinterpret_cast<const sockaddr_in*>(res->ai_src_addr);
  EXPECT_EQ(sin->sin_addr.s_addr, htonl(INADDR_ANY));
  EXPECT_EQ(ntohs(sin->sin_port), 7471);
  rdma_freeaddrinfo(res);

  rdma_addrinfo h2{};
  h2.ai_flags = RAI_NUMERICHOST;
  h2.ai_port_space = RDMA_PS_UDP;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7174", &h2, &res), 0);
  ASSERT_NE(res->ai_dst_addr, nullptr);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_UDP);
  rdma_freeaddrinfo(res);
  EXPECT_NE(rdma_getaddrinfo("not a host name", "7174", &h2, &res), 0);
}

TEST(CmDevices, OneDevice) {
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 1);
  EXPECT_NE(list[0], nullptr);
  EXPECT_EQ(list[1], nullptr);
  EXPECT_STREQ(ibv_get_device_name(list[0]->device), "softhca0");
  rdma_free_devices(list);
}

// ---- a peer process that dies ------------------------------------------------

TEST_F(CmApi, PeerKilledWhileConnectedMeansDisconnected) {
  const uint16_t port = test_port(0);
  Peer peer;
  ASSERT_TRUE(peer.start("accept", port));
  ASSERT_EQ(peer.line(), "READY\n");
  rdma_cm_id* client = resolved(port);
  rdma_conn_param param{};
  param.qp_num = 0x99;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  rdma_cm_event* resp = expect_event(ch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(resp, nullptr);
  EXPECT_STREQ(static_cast<const char*>(resp->param.conn.private_data), "peer");
  rdma_ack_cm_event(resp);
  ASSERT_EQ(rdma_establish(client), 0);
  ASSERT_EQ(peer.line(), "ESTABLISHED\n");

  peer.kill9();
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_DISCONNECTED);
  if (ev) rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(client), 0);

  // The dead peer's listening port is reclaimed, not leaked.
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in sin = loopback(port);
  EXPECT_EQ(rdma_bind_addr(id, sa(sin)), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(CmApi, PeerKilledDuringHandshakeMeansRejected) {
  const uint16_t port = test_port(1);
  Peer peer;
  ASSERT_TRUE(peer.start("hold", port));
  ASSERT_EQ(peer.line(), "READY\n");
  rdma_cm_id* client = resolved(port);
  rdma_conn_param param{};
  param.qp_num = 0x99;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  ASSERT_EQ(peer.line(), "REQUEST\n");
  peer.kill9();
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_REJECTED);
  if (ev) {
    EXPECT_EQ(ev->status, 28);
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

// A thread with SIGSEGV blocked dies at the first fault, and registering
// memory makes a buffer's neighbours fault for a moment (host/write_guard
// parks the writer until the pages have moved). So no thread of softhca's
// (they are named softhca-*) may block the synchronous signals; the CM
// thread used to block them all, and died when it wrote next to a buffer
// being registered. Other threads are not ours to judge: a sanitizer's
// runtime thread blocks every signal, as it may.
TEST_F(CmApi, NoThreadBlocksTheSignalsOfFaults) {
  uint16_t port = 0;
  rdma_cm_id* listener = listen_any(port);  // the CM service and its thread are up
  ASSERT_NE(listener, nullptr);
  // glibc starts each new thread with every signal blocked until it sets its
  // own mask: a thread seen that way a moment after its birth is asked again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::string blocking;
  bool saw_cm_thread = false;
  do {
    blocking.clear();
    DIR* tasks = opendir("/proc/self/task");
    ASSERT_NE(tasks, nullptr);
    while (dirent* e = readdir(tasks)) {
      if (e->d_name[0] == '.') continue;
      const std::string dir = std::string("/proc/self/task/") + e->d_name;
      std::string name;
      if (FILE* comm = std::fopen((dir + "/comm").c_str(), "r")) {
        char buf[32] = {};
        if (std::fgets(buf, sizeof buf, comm)) name = buf;
        std::fclose(comm);
      }
      if (name.rfind("softhca-", 0) != 0) continue;  // not one of ours
      saw_cm_thread |= name.rfind("softhca-cm", 0) == 0;
      FILE* status = std::fopen((dir + "/status").c_str(), "r");
      if (status == nullptr) continue;  // the thread has just ended
      char line[256];
      while (std::fgets(line, sizeof line, status)) {
        unsigned long long blocked = 0;
        if (std::sscanf(line, "SigBlk: %llx", &blocked) != 1) continue;
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL})
          if (blocked & (1ULL << (sig - 1)))
            blocking += std::string(" thread ") + e->d_name + " blocks signal " + std::to_string(sig) + ";";
      }
      std::fclose(status);
    }
    closedir(tasks);
  } while (!blocking.empty() && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(blocking, "");
  EXPECT_TRUE(saw_cm_thread) << "no thread named softhca-cm";
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

}  // namespace
