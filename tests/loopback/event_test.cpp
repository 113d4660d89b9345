// Completion channels (arming, solicited-only, non-blocking reads), CQ overrun
// as an async event, and shared receive queues (sharing, the limit event).
#include <fcntl.h>

#include <memory>
#include <set>
#include <vector>

#include "loopback.hpp"

namespace loopback {
namespace {

// ---------------------------------------------------------------------------
// 6. Completion channels.

struct ChannelSetup {
  Device dev;
  ibv_comp_channel* channel = ibv_create_comp_channel(dev.ctx);
  QpPair pair{dev, QpConfig{}, QpConfig{}, 256, channel};
  Buffer buf{dev.pd, 4096};
  bool ok() const { return channel != nullptr && pair.ok(); }

  void post_receives(int n) {
    for (int i = 0; i < n; ++i) {
      ibv_sge sge = buf.sge(2048 + 64 * i, 64);
      ASSERT_EQ(post_recv(pair.b, 1000 + i, &sge, 1), 0);
    }
  }
  void send(unsigned flags = 0) {
    ibv_sge sge = buf.sge(0, 32);
    ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1, IBV_SEND_SIGNALED | flags);
    ASSERT_EQ(post_send(pair.a, wr), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  }
  // Reads one event from the channel (which must be readable) and acks it.
  void expect_event() {
    ASSERT_TRUE(fd_readable(channel->fd, kDeadline)) << "no completion event";
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    ASSERT_EQ(ibv_get_cq_event(channel, &cq, &context), 0) << std::strerror(errno);
    EXPECT_EQ(cq, pair.b_recv_cq);
    EXPECT_EQ(context, &pair);
    ibv_ack_cq_events(cq, 1);
  }
};

TEST(CompletionChannel, ArmedCqSignalsTheNextCompletion) {
  auto s = std::make_unique<ChannelSetup>();
  ASSERT_TRUE(s->ok());
  s->post_receives(4);
  ASSERT_EQ(ibv_req_notify_cq(s->pair.b_recv_cq, 0), 0);
  EXPECT_FALSE(fd_readable(s->channel->fd, Millis{0}));
  s->send();
  s->expect_event();
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.wr_id, 1000u);
  // Not re-armed: the next completion is silent.
  s->send();
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_FALSE(fd_readable(s->channel->fd, Millis{20}));
  // Re-armed: it fires again.
  ASSERT_EQ(ibv_req_notify_cq(s->pair.b_recv_cq, 0), 0);
  s->send();
  s->expect_event();
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.wr_id, 1002u);
  ibv_comp_channel* channel = s->channel;
  s.reset();
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST(CompletionChannel, SolicitedOnlyFiresForSolicitedSend) {
  auto s = std::make_unique<ChannelSetup>();
  ASSERT_TRUE(s->ok());
  s->post_receives(2);
  ASSERT_EQ(ibv_req_notify_cq(s->pair.b_recv_cq, 1), 0);
  s->send();  // not solicited
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_FALSE(fd_readable(s->channel->fd, Millis{20})) << "an unsolicited SEND fired a solicited-only CQ";
  s->send(IBV_SEND_SOLICITED);
  s->expect_event();
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.wr_id, 1001u);
  ibv_comp_channel* channel = s->channel;
  s.reset();
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

// An error completion fires a solicited-only CQ too (IBTA 11.4.2.2).
TEST(CompletionChannel, SolicitedOnlyFiresForErrorCompletion) {
  auto s = std::make_unique<ChannelSetup>();
  ASSERT_TRUE(s->ok());
  s->post_receives(1);
  ASSERT_EQ(ibv_req_notify_cq(s->pair.b_recv_cq, 1), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(s->pair.b, &attr, IBV_QP_STATE), 0);  // flushes the receive
  s->expect_event();
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s->pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  ibv_comp_channel* channel = s->channel;
  s.reset();
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST(CompletionChannel, NonBlockingChannelIsEagainWhenEmpty) {
  auto s = std::make_unique<ChannelSetup>();
  ASSERT_TRUE(s->ok());
  const int flags = fcntl(s->channel->fd, F_GETFL);
  ASSERT_EQ(fcntl(s->channel->fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(s->channel, &cq, &context), -1);
  EXPECT_EQ(errno, EAGAIN);
  // With an event pending it succeeds without blocking.
  s->post_receives(1);
  ASSERT_EQ(ibv_req_notify_cq(s->pair.b_recv_cq, 0), 0);
  s->send();
  s->expect_event();
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(s->channel, &cq, &context), -1);
  EXPECT_EQ(errno, EAGAIN);
  ibv_comp_channel* channel = s->channel;
  s.reset();
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

// The channel also fires for completions a send CQ produces locally.
TEST(CompletionChannel, SendCqEvent) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* channel = ibv_create_comp_channel(dev.ctx);
  ASSERT_NE(channel, nullptr);
  ibv_cq* scq = ibv_create_cq(dev.ctx, 16, nullptr, channel, 0);
  ibv_cq* rcq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  QpConfig cfg;
  ibv_qp* qp = create_qp(dev.pd, scq, rcq, cfg);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(bring_up(qp, qp->qp_num, dev.gid, cfg), 0);  // connected to itself
  {
    Buffer buf(dev.pd, 64);
    ASSERT_EQ(ibv_req_notify_cq(scq, 0), 0);
    ibv_sge sge = buf.sge(0, 8);
    ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = buf.addr(32);
    wr.wr.rdma.rkey = buf.rkey();
    ASSERT_EQ(post_send(qp, wr), 0);
    ASSERT_TRUE(fd_readable(channel->fd, kDeadline));
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    ASSERT_EQ(ibv_get_cq_event(channel, &cq, &context), 0);
    EXPECT_EQ(cq, scq);
    ibv_ack_cq_events(cq, 1);
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(scq), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

// A CQ of 4 entries that receives 8 completions overruns: IBV_EVENT_CQ_ERR.
TEST(CqOverrun, RaisesCqErrAsyncEvent) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* small = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(small, nullptr);
  ASSERT_GE(small->cqe, 4);
  ASSERT_LT(small->cqe, 8) << "this test needs the CQ to hold fewer than 8";
  QpConfig cfg;
  cfg.max_send_wr = 16;
  ibv_qp* qp = create_qp(dev.pd, small, rcq, cfg);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(bring_up(qp, qp->qp_num, dev.gid, cfg), 0);
  {
    Buffer buf(dev.pd, 64);
    ibv_sge sge = buf.sge(0, 8);
    // A send queue deeper than the CQ: 16 completions for 8 slots.
    for (int i = 0; i < 16; ++i) {
      ibv_send_wr wr = make_wr(i, IBV_WR_RDMA_WRITE, &sge, 1);
      wr.wr.rdma.remote_addr = buf.addr(32);
      wr.wr.rdma.rkey = buf.rkey();
      ASSERT_EQ(post_send(qp, wr), 0);
    }
    decltype(ibv_async_event::element) element{};
    ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_CQ_ERR, &element)) << "no CQ_ERR event";
    EXPECT_EQ(element.cq, small);
  }
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(small), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

// A CQ exactly as large as its load does not overrun.
TEST(CqOverrun, FullButNotOverrun) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  QpConfig cfg;
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(bring_up(qp, qp->qp_num, dev.gid, cfg), 0);
  {
    Buffer buf(dev.pd, 64);
    ibv_sge sge = buf.sge(0, 8);
    for (int i = 0; i < cq->cqe; ++i) {
      ibv_send_wr wr = make_wr(i, IBV_WR_RDMA_WRITE, &sge, 1);
      wr.wr.rdma.remote_addr = buf.addr(32);
      wr.wr.rdma.rkey = buf.rkey();
      ASSERT_EQ(post_send(qp, wr), 0);
    }
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{20}));
    auto wcs = poll_n(cq, cq->cqe);
    EXPECT_EQ(wcs.size(), size_t(cq->cqe));
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// The first message that reaches a QP still in RTR raises IBV_EVENT_COMM_EST.
TEST(AsyncEvent, CommEstablishedOnFirstReceiveInRtr) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* b = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, cfg), 0);
  ASSERT_EQ(qp_to_init(b, cfg), 0);
  ASSERT_EQ(qp_to_rtr(b, a->qp_num, dev.gid, cfg), 0);  // b stays in RTR
  {
    Buffer buf(dev.pd, 64);
    ibv_sge rsge = buf.sge(0, 32);
    ASSERT_EQ(post_recv(b, 1, &rsge, 1), 0);
    ibv_sge sge = buf.sge(32, 16);
    ibv_send_wr wr = make_wr(2, IBV_WR_SEND, &sge, 1);
    ASSERT_EQ(post_send(a, wr), 0);
    auto wcs = poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    decltype(ibv_async_event::element) element{};
    ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_COMM_EST, &element));
    EXPECT_EQ(element.qp, b);
    // Only once.
    ASSERT_EQ(post_recv(b, 3, &rsge, 1), 0);
    ASSERT_EQ(post_send(a, wr), 0);
    wcs = poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{20}));
  }
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// A QP destroyed right after a peer's error put it in ERROR: the event that
// reports it travels through the process's event ring and the progress
// thread, and may be relayed while ibv_destroy_qp runs. It must not stay
// queued naming the freed QP (ibv_get_async_event then read freed memory:
// the memory window tests hung on a freed mutex now and then), and an
// event dropped with its QP must take its count on async_fd with it.
TEST(AsyncEvent, NoEventOutlivesAQpDestroyedWhileItsErrorIsRelayed) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  Buffer local(dev.pd, 64), target(dev.pd, 64, IBV_ACCESS_LOCAL_WRITE);  // no remote access
  constexpr int kPairs = 16;
  for (int round = 0; round < 150; ++round) {
    std::vector<std::unique_ptr<QpPair>> pairs;
    for (int i = 0; i < kPairs; ++i) {
      pairs.push_back(std::make_unique<QpPair>(dev, QpConfig{}));
      ASSERT_TRUE(pairs.back()->ok());
    }
    // Every b goes to ERROR at once; their QP_ACCESS_ERRs queue up for the
    // progress thread, which relays them while the QPs are destroyed.
    for (auto& pair : pairs) {
      ibv_sge sge = local.sge(0, 64);
      ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
      wr.wr.rdma.remote_addr = target.addr();
      wr.wr.rdma.rkey = target.rkey();
      ASSERT_EQ(post_send(pair->a, wr), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(pair->a_send_cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
    }
    for (auto& pair : pairs) pair->destroy_b();
  }
  // Whatever was raised for them was dropped with them. (An event left
  // over is reported, not acked: the QP it names is gone.)
  const bool left_over = fd_readable(dev.ctx->async_fd, Millis{50});
  EXPECT_FALSE(left_over);
  ibv_async_event left{};
  if (left_over && ibv_get_async_event(dev.ctx, &left) == 0)
    ADD_FAILURE() << "left over: " << ibv_event_type_str(left.event_type) << " for qp " << left.element.qp;
}

// ---------------------------------------------------------------------------
// 7. Shared receive queues.

struct SrqSetup {
  Device dev;
  ibv_srq* srq = nullptr;
  ibv_cq* cq = nullptr;  // every completion of the four QPs
  ibv_qp* a[2] = {};     // senders
  ibv_qp* b[2] = {};     // receivers on the SRQ
  QpConfig cfg;

  explicit SrqSetup(uint32_t max_wr = 64, uint32_t limit = 0) {
    if (!dev.ok()) return;
    ibv_srq_init_attr init{};
    init.attr.max_wr = max_wr;
    init.attr.max_sge = 2;
    init.attr.srq_limit = limit;
    srq = ibv_create_srq(dev.pd, &init);
    cq = ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0);
    if (!srq || !cq) return;
    for (int i = 0; i < 2; ++i) {
      a[i] = create_qp(dev.pd, cq, cq, cfg);
      b[i] = create_qp(dev.pd, cq, cq, cfg, srq);
      if (!a[i] || !b[i]) return;
    }
    for (int i = 0; i < 2; ++i) {
      if (bring_up(a[i], b[i]->qp_num, dev.gid, cfg) || bring_up(b[i], a[i]->qp_num, dev.gid, cfg)) return;
    }
    up = true;
  }
  ~SrqSetup() {
    for (ibv_qp* qp : {a[0], a[1], b[0], b[1]})
      if (qp) ibv_destroy_qp(qp);
    if (srq) ibv_destroy_srq(srq);
    if (cq) ibv_destroy_cq(cq);
  }
  bool up = false;

  int post_srq(uint64_t wr_id, ibv_sge* sge) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
  }
  // A SEND from a[i] to b[i], waiting for both completions; returns the receive completion.
  ibv_wc send(int i, ibv_sge* sge) {
    ibv_send_wr wr = make_wr(500 + i, IBV_WR_SEND, sge, 1);
    ibv_wc recv{};
    recv.status = IBV_WC_GENERAL_ERR;
    if (post_send(a[i], wr) != 0) return recv;
    auto wcs = poll_n(cq, 2);
    for (const ibv_wc& wc : wcs)
      if (wc.opcode & IBV_WC_RECV) recv = wc;
    return recv;
  }
};

TEST(Srq, SharedByTwoQps) {
  SrqSetup s;
  ASSERT_TRUE(s.up);
  Buffer src(s.dev.pd, 8 * 128);
  Buffer dst(s.dev.pd, 8 * 128);
  fill_pattern(src.span(0, src.size()), 99);
  for (int k = 0; k < 8; ++k) {
    ibv_sge sge = dst.sge(k * 128, 128);
    ASSERT_EQ(s.post_srq(k, &sge), 0);
  }
  std::set<uint64_t> wr_ids;
  for (int k = 0; k < 8; ++k) {
    const int i = k % 2;
    ibv_sge sge = src.sge(k * 128, 100 + k);
    const ibv_wc wc = s.send(i, &sge);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.qp_num, s.b[i]->qp_num);
    EXPECT_EQ(wc.src_qp, s.a[i]->qp_num);
    EXPECT_EQ(wc.byte_len, uint32_t(100 + k));
    EXPECT_EQ(wc.wr_id, uint64_t(k)) << "SRQ WQEs are taken in order";
    wr_ids.insert(wc.wr_id);
    EXPECT_EQ(first_mismatch(dst.span(wc.wr_id * 128, 100 + k), src.span(k * 128, 100 + k)), -1);
  }
  EXPECT_EQ(wr_ids.size(), 8u);
  // Receives go to the SRQ, not to the QP.
  ibv_sge sge = dst.sge(0, 8);
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_NE(ibv_post_recv(s.b[0], &wr, &bad), 0);
  // Destroying a QP on the SRQ leaves the SRQ's WQEs to the other QP.
  ASSERT_EQ(s.post_srq(50, &sge), 0);
  ASSERT_EQ(ibv_destroy_qp(s.b[0]), 0);
  s.b[0] = nullptr;
  const ibv_wc wc = s.send(1, &sge);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 50u);
}

TEST(Srq, LimitReachedEventWhenCountDropsBelowLimit) {
  SrqSetup s(16);
  ASSERT_TRUE(s.up);
  Buffer buf(s.dev.pd, 4096);
  for (int k = 0; k < 10; ++k) {
    ibv_sge sge = buf.sge(k * 64, 64);
    ASSERT_EQ(s.post_srq(k, &sge), 0);
  }
  ibv_srq_attr attr{};
  attr.srq_limit = 5;
  ASSERT_EQ(ibv_modify_srq(s.srq, &attr, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr queried{};
  ASSERT_EQ(ibv_query_srq(s.srq, &queried), 0);
  EXPECT_EQ(queried.srq_limit, 5u);
  EXPECT_GE(queried.max_wr, 16u);

  ibv_sge sge = buf.sge(2048, 8);
  // 10 -> 5 WQEs: not below the limit yet.
  for (int k = 0; k < 5; ++k) ASSERT_EQ(s.send(k % 2, &sge).status, IBV_WC_SUCCESS);
  EXPECT_FALSE(fd_readable(s.dev.ctx->async_fd, Millis{20})) << "limit event before the count fell below it";
  // 5 -> 4: below.
  ASSERT_EQ(s.send(0, &sge).status, IBV_WC_SUCCESS);
  decltype(ibv_async_event::element) element{};
  ASSERT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &element));
  EXPECT_EQ(element.srq, s.srq);
  // The limit disarmed itself: no second event.
  ASSERT_EQ(ibv_query_srq(s.srq, &queried), 0);
  EXPECT_EQ(queried.srq_limit, 0u);
  ASSERT_EQ(s.send(1, &sge).status, IBV_WC_SUCCESS);
  EXPECT_FALSE(fd_readable(s.dev.ctx->async_fd, Millis{20}));
  // Re-arm above the current count (3): the next consumption fires again.
  attr.srq_limit = 8;
  ASSERT_EQ(ibv_modify_srq(s.srq, &attr, IBV_SRQ_LIMIT), 0);
  ASSERT_EQ(s.send(0, &sge).status, IBV_WC_SUCCESS);
  ASSERT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &element));
  EXPECT_EQ(element.srq, s.srq);
}

TEST(Srq, OverCapacityIsEnomemAndBadModifyIsEinval) {
  SrqSetup s(8);
  ASSERT_TRUE(s.up);
  ibv_srq_attr attr{};
  ASSERT_EQ(ibv_query_srq(s.srq, &attr), 0);
  Buffer buf(s.dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  for (uint32_t k = 0; k < attr.max_wr; ++k) ASSERT_EQ(s.post_srq(k, &sge), 0);
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(s.srq, &wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr);
  // A limit above max_wr is refused.
  ibv_srq_attr limit{};
  limit.srq_limit = attr.max_wr + 1;
  EXPECT_EQ(ibv_modify_srq(s.srq, &limit, IBV_SRQ_LIMIT), EINVAL);
  // A QP still uses it: EBUSY.
  EXPECT_EQ(ibv_destroy_srq(s.srq), EBUSY);
}

}  // namespace
}  // namespace loopback
