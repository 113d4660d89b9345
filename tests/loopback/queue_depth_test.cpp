// Queues count like hardware: a send WQE holds its slot until its completion
// (or a later one of the same send queue) is polled, a receive WQE until its
// completion is polled, and post past the depth is ENOMEM. A CQ as deep as the
// queues that feed it therefore never overruns. And the sizes granted follow
// ConnectX's rules (engine/queue_sizes.hpp), reported in the caps.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "loopback.hpp"

namespace loopback {
namespace {

ibv_send_wr write_wr(Buffer& buf, ibv_sge& sge, uint64_t wr_id, unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr wr = make_wr(wr_id, IBV_WR_RDMA_WRITE, &sge, 1, flags);
  wr.wr.rdma.remote_addr = buf.addr(64);
  wr.wr.rdma.rkey = buf.rkey();
  return wr;
}

ibv_qp_cap caps_of(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(qp, &attr, IBV_QP_CAP, &init), 0);
  return attr.cap;
}

TEST(QueueDepth, SendQueueFillsUntilCompletionsArePolled) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 16;
  QpPair pair(dev, cfg, 256);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.a).max_send_wr;
  ASSERT_EQ(depth, 16u);
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  for (uint32_t i = 0; i < depth; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, i);
    ASSERT_EQ(post_send(pair.a, wr), 0) << "post " << i;
  }
  // Every WQE executed, but no completion was polled: the queue is full.
  ibv_send_wr extra = write_wr(buf, sge, 100);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(pair.a, &extra, &bad), ENOMEM);
  EXPECT_EQ(bad, &extra);
  // One polled completion frees one slot, exactly.
  ibv_wc wc;
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 0u);
  EXPECT_EQ(wc.src_qp, 0u) << "send completions carry no source QP";
  EXPECT_EQ(post_send(pair.a, extra), 0);
  ibv_send_wr more = write_wr(buf, sge, 101);
  EXPECT_EQ(post_send(pair.a, more), ENOMEM);
  // Polling all of them frees the whole queue.
  EXPECT_EQ(poll_n(pair.a_send_cq, depth).size(), depth);
  for (uint32_t i = 0; i < depth; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, 200 + i);
    ASSERT_EQ(post_send(pair.a, wr), 0) << "post " << i << " after polling";
  }
  EXPECT_EQ(poll_n(pair.a_send_cq, depth).size(), depth);
}

// rping's pattern: one thread posts, another sleeps on the completion channel
// and polls the send CQ when woken. A slot is free as soon as its completion
// was polled, however the two threads interleave: posting whenever the
// poller's count says there is room must never meet ENOMEM. (The wake-up can
// preempt the posting thread right after its completion was written; that
// once left slots unfreed, and rping's client failed with "post send error 12".)
TEST(QueueDepth, SlotsFreeAsAChannelWokenThreadPolls) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* channel = ibv_create_comp_channel(dev.ctx);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  QpConfig cfg;
  cfg.max_send_wr = 4;
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(bring_up(qp, qp->qp_num, dev.gid, cfg), 0);
  constexpr int kPosts = 5000;
  std::atomic<int> polled{0};
  std::atomic<bool> poll_error{false};
  std::atomic<bool> stop{false};
  {
    Buffer buf(dev.pd, 256);
    ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
    std::thread poller([&] {
      ibv_wc wc[4];
      while (!stop.load() && polled.load() < kPosts) {
        if (!fd_readable(channel->fd, Millis{100})) continue;
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) != 0) {
          poll_error = true;
          return;
        }
        ibv_ack_cq_events(ev_cq, 1);
        if (ibv_req_notify_cq(cq, 0) != 0) poll_error = true;
        int got;
        while ((got = ibv_poll_cq(cq, 4, wc)) > 0) {
          for (int k = 0; k < got; ++k)
            if (wc[k].status != IBV_WC_SUCCESS) poll_error = true;
          polled.fetch_add(got);
        }
        if (got < 0) poll_error = true;
      }
    });
    ibv_sge sge = buf.sge(0, 8);
    int refused = 0, posted = 0;
    const auto until = Clock::now() + Millis{30000};
    while (posted < kPosts && Clock::now() < until) {
      if (posted - polled.load() >= 4) {
        std::this_thread::yield();
        continue;
      }
      ibv_send_wr wr = write_wr(buf, sge, static_cast<uint64_t>(posted));
      if (post_send(qp, wr) != 0) {
        ++refused;
        break;
      }
      ++posted;
    }
    const auto drained = Clock::now() + Millis{5000};
    while (polled.load() < posted && Clock::now() < drained) std::this_thread::yield();
    stop = true;
    poller.join();
    EXPECT_EQ(refused, 0) << "ENOMEM after " << posted << " posts with " << polled.load() << " completions polled";
    EXPECT_EQ(posted, kPosts);
    EXPECT_EQ(polled.load(), posted);
    EXPECT_FALSE(poll_error.load());
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

// Unsignaled WQEs hold their slots until a later signaled completion of the
// same send queue is polled; with nothing signaled, the queue fills for good.
TEST(QueueDepth, UnsignaledSlotsFreeWithALaterSignaledCompletion) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 8;
  QpPair pair(dev, cfg, 64);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  for (uint32_t i = 0; i < 7; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, i, 0);
    ASSERT_EQ(post_send(pair.a, wr), 0);
  }
  ibv_send_wr signaled = write_wr(buf, sge, 7);
  ASSERT_EQ(post_send(pair.a, signaled), 0);
  ibv_send_wr extra = write_wr(buf, sge, 8, 0);
  EXPECT_EQ(post_send(pair.a, extra), ENOMEM);
  ibv_wc wc;
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 7u);
  // Every WR executed at post time (the shm link is synchronous): nothing else can come.
  EXPECT_EQ(ibv_poll_cq(pair.a_send_cq, 1, &wc), 0);
  // The one polled completion retired all eight slots.
  for (uint32_t i = 0; i < 8; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, 10 + i, 0);
    ASSERT_EQ(post_send(pair.a, wr), 0) << "post " << i;
  }
  EXPECT_EQ(post_send(pair.a, extra), ENOMEM) << "eight unsignaled WQEs and nothing to retire them";
}

// The probe of the issue: max_send_wr 1024, 10,000 posts, nothing polled.
// Exactly 1024 are accepted, the CQ of 1024 does not overrun, and every
// completion is there.
TEST(QueueDepth, PostsPastTheDepthAreRefusedAndTheCqNeverOverruns) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 1024;
  QpPair pair(dev, cfg, 1024);
  ASSERT_TRUE(pair.ok());
  ASSERT_EQ(caps_of(pair.a).max_send_wr, 1024u);
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 10000; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, static_cast<uint64_t>(i));
    const int rc = post_send(pair.a, wr);
    if (rc == 0) {
      ++accepted;
    } else {
      EXPECT_EQ(rc, ENOMEM);
      ++refused;
    }
  }
  EXPECT_EQ(accepted, 1024);
  EXPECT_EQ(refused, 10000 - 1024);
  // An overrun of this process's own send CQ raises CQ_ERR in the posting
  // thread, so it would be pending already.
  EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR?) was raised";
  const auto wcs = poll_n(pair.a_send_cq, 1024);
  ASSERT_EQ(wcs.size(), 1024u);
  for (size_t i = 0; i < wcs.size(); ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[i].wr_id, i);
  }
}

// A QP reset while another thread polls its CQs: the poll frees slots as it
// retires completions, and the reset frees every slot at once; whichever
// comes first, the counts must end exact -- a retirement landing after the
// reset and moving the count back would leave slots taken for good (ENOMEM
// below the depth), one moving it forward would let posts pass the depth.
// Rounds reset the sender `a` (its sends' completions on their way to one
// poller) and the receiver `b` (its receive completions, to the other) in
// turn. a sends only as many SENDs as b posted receives in the round, so
// none waits for a receive.
TEST(QueueDepth, ResetsRacingAPollerKeepTheCountsExact) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 16;
  cfg.max_recv_wr = 16;
  QpPair pair(dev, cfg, 256);
  ASSERT_TRUE(pair.ok());
  const uint32_t send_depth = caps_of(pair.a).max_send_wr;
  const uint32_t recv_depth = caps_of(pair.b).max_recv_wr;
  Buffer buf(dev.pd, 4096);
  ibv_sge sge = buf.sge(0, 8);
  ibv_sge rsge = buf.sge(2048, 64);
  std::atomic<bool> stop{false};
  std::atomic<int> bad_completions{0};
  // Each poller says when it found its CQ empty after a round was posted:
  // the next round waits for that, so that the completions a reset leaves
  // in the ring (skipped when polled) never pile up to an overrun.
  std::atomic<int> round_posted{-1};
  std::atomic<int> drained[2] = {-1, -1};
  auto poll_until_stopped = [&](ibv_cq* cq, int which) {
    ibv_wc wc[8];
    while (!stop.load()) {
      const int round = round_posted.load();
      const int got = ibv_poll_cq(cq, 8, wc);
      if (got < 0) bad_completions.fetch_add(1);
      for (int k = 0; k < got; ++k)
        if (wc[k].status != IBV_WC_SUCCESS) bad_completions.fetch_add(1);
      if (got == 0) drained[which].store(round);
    }
  };
  std::thread send_poller(poll_until_stopped, pair.a_send_cq, 0);
  std::thread recv_poller(poll_until_stopped, pair.b_recv_cq, 1);
  uint32_t b_holds = 0;  // receives posted on b and not yet taken by a SEND
  for (int round = 0; round < 300; ++round) {
    uint32_t posted = 0;
    while (posted < recv_depth && post_recv(pair.b, posted, &rsge, 1) == 0) ++posted;
    b_holds += posted;
    for (uint32_t i = 0; i < posted; ++i) {
      ibv_send_wr wr = make_wr(i, IBV_WR_SEND, &sge, 1);
      if (post_send(pair.a, wr) != 0) break;
      --b_holds;
    }
    for (uint32_t i = 0; i < send_depth; ++i) {
      ibv_send_wr wr = write_wr(buf, sge, i);
      if (post_send(pair.a, wr) != 0) break;
    }
    ibv_qp* qp = (round & 1) ? pair.b : pair.a;
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &reset, IBV_QP_STATE), 0) << "round " << round;
    ASSERT_EQ(bring_up(qp, qp == pair.a ? pair.b->qp_num : pair.a->qp_num, dev.gid, cfg), 0) << "round " << round;
    if (qp == pair.b) b_holds = 0;
    round_posted.store(round);
    const auto until = Clock::now() + kDeadline;
    while ((drained[0].load() < round || drained[1].load() < round) && Clock::now() < until) std::this_thread::yield();
    ASSERT_TRUE(drained[0].load() >= round && drained[1].load() >= round) << "round " << round << ": the pollers stopped";
  }
  stop = true;
  send_poller.join();
  recv_poller.join();
  EXPECT_EQ(bad_completions.load(), 0);
  ibv_wc wc;
  while (ibv_poll_cq(pair.a_send_cq, 1, &wc) > 0 || ibv_poll_cq(pair.b_recv_cq, 1, &wc) > 0) {
  }
  // Every completion polled: a's whole send queue is free, and b's but for
  // the receives it still holds.
  for (uint32_t i = 0; i < send_depth; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, i);
    ASSERT_EQ(post_send(pair.a, wr), 0) << "send " << i << " of " << send_depth;
  }
  ibv_send_wr extra = write_wr(buf, sge, 99);
  EXPECT_EQ(post_send(pair.a, extra), ENOMEM) << "a's send queue holds more than its depth";
  ASSERT_LE(b_holds, recv_depth);
  for (uint32_t i = b_holds; i < recv_depth; ++i)
    ASSERT_EQ(post_recv(pair.b, i, &rsge, 1), 0) << "receive " << i << " of " << recv_depth << ", " << b_holds << " held";
  EXPECT_EQ(post_recv(pair.b, 99, &rsge, 1), ENOMEM) << "b's receive queue holds more than its depth";
}

// A second connection c <-> d beside `pair`'s: c shares a's CQs, d b's.
// Destroyed before the pair (declared after it), as its CQs outlive it.
struct SharedCqConnection {
  SharedCqConnection(Device& dev, QpPair& pair, const QpConfig& cfg)
      : c(create_qp(dev.pd, pair.a_send_cq, pair.a_recv_cq, cfg)), d(create_qp(dev.pd, pair.b_send_cq, pair.b_recv_cq, cfg)) {
    up = c != nullptr && d != nullptr && bring_up(c, d->qp_num, dev.gid, cfg) == 0 &&
         bring_up(d, c->qp_num, dev.gid, cfg) == 0;
  }
  ~SharedCqConnection() {
    for (ibv_qp* qp : {c, d}) {
      if (qp != nullptr) {
        EXPECT_EQ(ibv_destroy_qp(qp), 0);
      }
    }
  }
  SharedCqConnection(const SharedCqConnection&) = delete;
  SharedCqConnection& operator=(const SharedCqConnection&) = delete;
  ibv_qp* c;
  ibv_qp* d;
  bool up = false;
};

// A reset QP's completions leave its CQ at once, as mlx5 cleans them out
// (cq_clean): a QP posting a full send queue and being reset, round after
// round, with nobody polling, never overruns a CQ that holds two rounds;
// and another QP's completions on the same CQ stay, in their order. (They
// used to be skipped only when polled, keeping their room until then.)
TEST(QueueDepth, AResetQpsCompletionsFreeTheirRoomInTheCq) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 16;
  QpPair pair(dev, cfg, 31);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.a).max_send_wr;
  ASSERT_EQ(depth, 16u);
  ASSERT_LT(pair.a_send_cq->cqe, static_cast<int>(3 * depth)) << "the CQ must be too small to hold three rounds";
  // `c` shares a's send CQ; it writes through its own connection to `d`.
  SharedCqConnection second(dev, pair, cfg);
  ASSERT_TRUE(second.up);
  ibv_qp* c = second.c;
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  constexpr uint64_t kRounds = 10;
  for (uint64_t round = 0; round < kRounds; ++round) {
    ibv_send_wr kept = write_wr(buf, sge, 1000 + round);
    ASSERT_EQ(post_send(c, kept), 0) << "round " << round;
    for (uint32_t i = 0; i < depth; ++i) {
      ibv_send_wr wr = write_wr(buf, sge, i);
      ASSERT_EQ(post_send(pair.a, wr), 0) << "round " << round << ", post " << i;
    }
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(pair.a, &reset, IBV_QP_STATE), 0) << "round " << round;
    ASSERT_EQ(bring_up(pair.a, pair.b->qp_num, dev.gid, cfg), 0) << "round " << round;
  }
  EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR: an overrun?) was raised";
  const auto wcs = poll_n(pair.a_send_cq, kRounds + 1, Millis{200});
  ASSERT_EQ(wcs.size(), kRounds) << "only c's completions are left";
  for (uint64_t round = 0; round < kRounds; ++round) {
    EXPECT_EQ(wcs[round].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[round].qp_num, c->qp_num);
    EXPECT_EQ(wcs[round].wr_id, 1000 + round);
  }
  // a works after its resets, and its new completions are polled.
  ibv_send_wr after = write_wr(buf, sge, 77);
  ASSERT_EQ(post_send(pair.a, after), 0);
  ibv_wc wc;
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.qp_num, pair.a->qp_num);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// The clean-out above races producers: one thread keeps writing on `a`,
// whose completions it pushes into a CQ that `c` shares, while the main
// thread fills c's send queue and resets c, and a third thread polls. The
// clean-out moves completions within the ring while the writer appends
// behind them; a's completions must all arrive, once each, in order.
// A producer preempted between its reservation and its store holds every
// completion behind its slot in the ring (the poller cannot pass it and the
// clean-out stops there, as in any CQ that software fills), so rounds run
// on while the writer is held would pile c's completions up to an overrun
// (TSan's slow pushes did that): after four rounds without a new write the
// main thread waits for one.
TEST(QueueDepth, ResetCleanOutsRacingAProducerLoseNoOtherCompletion) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 16;
  QpPair pair(dev, cfg, 255);
  ASSERT_TRUE(pair.ok());
  SharedCqConnection second(dev, pair, cfg);
  ASSERT_TRUE(second.up);
  ibv_qp* c = second.c;
  ibv_qp* d = second.d;
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  constexpr uint64_t kWrites = 20'000;
  std::atomic<bool> writer_done{false}, writer_failed{false};
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    ibv_sge own = buf.sge(64, 8);
    const auto until = Clock::now() + kDeadline;
    for (uint64_t i = 0; i < kWrites && Clock::now() < until;) {
      ibv_send_wr wr = write_wr(buf, own, i);
      const int rc = post_send(pair.a, wr);
      if (rc == 0) {
        written.store(++i);  // its completion is published: post_send pushed it
      } else if (rc == ENOMEM) {
        std::this_thread::yield();  // the poller frees slots
      } else {
        writer_failed = true;
        break;
      }
    }
    writer_done = true;
  });
  std::atomic<bool> stop{false};
  // The main thread watches the first two while the poller counts them.
  std::atomic<uint64_t> next_of_a{0}, out_of_order{0};
  uint64_t of_c = 0, bad = 0;
  std::thread poller([&] {
    ibv_wc wc[16];
    while (!stop.load()) {
      const int got = ibv_poll_cq(pair.a_send_cq, 16, wc);
      if (got < 0) ++bad;
      for (int k = 0; k < got; ++k) {
        if (wc[k].status != IBV_WC_SUCCESS) ++bad;
        if (wc[k].qp_num == c->qp_num) {
          ++of_c;
        } else if (wc[k].wr_id == next_of_a.load()) {
          ++next_of_a;
        } else {
          ++out_of_order;
        }
      }
    }
  });
  int rounds = 0;
  uint64_t c_posted = 0;
  bool resets_worked = true;  // (no ASSERT here: the threads must be joined)
  uint64_t writes_seen = 0;
  int rounds_since_a_write = 0;  // at most 4: 64 of c's completions behind a held slot, with a's 16 far from 255
  for (; resets_worked && !writer_done.load(); ++rounds) {
    while (written.load() == writes_seen && rounds_since_a_write >= 4 && !writer_done.load())
      std::this_thread::yield();
    rounds_since_a_write = written.load() == writes_seen ? rounds_since_a_write + 1 : 0;
    writes_seen = written.load();
    for (uint32_t i = 0; i < cfg.max_send_wr; ++i) {
      ibv_send_wr wr = write_wr(buf, sge, i);
      if (post_send(c, wr) != 0) break;
      ++c_posted;
    }
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    resets_worked = ibv_modify_qp(c, &reset, IBV_QP_STATE) == 0 && bring_up(c, d->qp_num, dev.gid, cfg) == 0;
  }
  EXPECT_TRUE(resets_worked) << "round " << rounds << ": the reset or the way back to RTS failed";
  writer.join();
  const auto until = Clock::now() + kDeadline;
  while (next_of_a < kWrites && out_of_order == 0 && Clock::now() < until) std::this_thread::yield();
  stop = true;
  poller.join();
  std::printf("%d resets of c while a wrote %llu; %llu of c's %llu completions were polled before a reset\n", rounds,
              static_cast<unsigned long long>(kWrites), static_cast<unsigned long long>(of_c),
              static_cast<unsigned long long>(c_posted));
  EXPECT_FALSE(writer_failed.load());
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(out_of_order.load(), 0u) << "a's completion " << next_of_a.load() << " was lost, repeated or reordered";
  EXPECT_EQ(next_of_a.load(), kWrites);
  EXPECT_LE(of_c, c_posted);
  EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR: an overrun?) was raised";
}

// Flushed WQEs complete, and polling the flush completions frees their slots.
TEST(QueueDepth, FlushCompletionsFreeTheirSlots) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 4;
  cfg.max_recv_wr = 4;
  QpPair pair(dev, cfg, 64);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 256);
  ibv_sge sge = buf.sge(0, 8);
  ibv_sge rsge = buf.sge(128, 64);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv(pair.a, 50 + i, &rsge, 1), 0);
  EXPECT_EQ(post_recv(pair.a, 60, &rsge, 1), ENOMEM);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(pair.a, &attr, IBV_QP_STATE), 0);
  // In ERROR a post completes at once, flushed; the queue still counts it.
  for (int i = 0; i < 4; ++i) {
    ibv_send_wr wr = write_wr(buf, sge, i);
    ASSERT_EQ(post_send(pair.a, wr), 0);
  }
  ibv_send_wr extra = write_wr(buf, sge, 9);
  EXPECT_EQ(post_send(pair.a, extra), ENOMEM);
  EXPECT_EQ(post_recv(pair.a, 61, &rsge, 1), ENOMEM);
  const auto sent = poll_n(pair.a_send_cq, 4);
  ASSERT_EQ(sent.size(), 4u);
  for (const auto& wc : sent) EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  const auto received = poll_n(pair.a_recv_cq, 4);
  ASSERT_EQ(received.size(), 4u);
  for (const auto& wc : received) EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(post_send(pair.a, extra), 0);
  EXPECT_EQ(post_recv(pair.a, 62, &rsge, 1), 0);
  EXPECT_EQ(poll_n(pair.a_send_cq, 1).size(), 1u);
  EXPECT_EQ(poll_n(pair.a_recv_cq, 1).size(), 1u);
}

// A receive WQE that a SEND consumed still holds its slot until its
// completion is polled: a receiver cannot keep more completions unpolled than
// its receive queue is deep.
TEST(QueueDepth, ReceiveQueueFillsUntilReceiveCompletionsArePolled) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_recv_wr = 4;
  QpPair pair(dev, cfg, 64);
  ASSERT_TRUE(pair.ok());
  ASSERT_EQ(caps_of(pair.b).max_recv_wr, 4u);
  Buffer buf(dev.pd, 1024);
  ibv_sge sge = buf.sge(0, 8);
  for (int i = 0; i < 4; ++i) {
    ibv_sge rsge = buf.sge(64 + 64 * static_cast<size_t>(i), 64);
    ASSERT_EQ(post_recv(pair.b, 10 + i, &rsge, 1), 0);
  }
  ibv_sge rsge = buf.sge(512, 64);
  EXPECT_EQ(post_recv(pair.b, 20, &rsge, 1), ENOMEM);
  for (int i = 0; i < 4; ++i) {
    ibv_send_wr wr = make_wr(i, IBV_WR_SEND, &sge, 1);
    ASSERT_EQ(post_send(pair.a, wr), 0);
  }
  ASSERT_EQ(poll_n(pair.a_send_cq, 4).size(), 4u);
  // All four were consumed by the SENDs, none polled yet.
  EXPECT_EQ(post_recv(pair.b, 21, &rsge, 1), ENOMEM);
  ibv_wc wc;
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(post_recv(pair.b, 22, &rsge, 1), 0);
  EXPECT_EQ(post_recv(pair.b, 23, &rsge, 1), ENOMEM);
  EXPECT_EQ(poll_n(pair.b_recv_cq, 3).size(), 3u);
}

// An SRQ of 3 WQEs (3 + 1 spare is a power of two), and two connected RC
// QPs on one CQ: `a` sends, `b` receives from the SRQ.
struct SrqPair {
  SrqPair() {
    ibv_srq_init_attr sattr{};
    sattr.attr.max_wr = 3;
    sattr.attr.max_sge = 1;
    srq = ibv_create_srq(dev.pd, &sattr);
    granted = sattr.attr.max_wr;
    cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
    if (!srq || !cq) return;
    a = create_qp(dev.pd, cq, cq, cfg);
    b = create_qp(dev.pd, cq, cq, cfg, srq);
    up = a && b && bring_up(a, b->qp_num, dev.gid, cfg) == 0 && bring_up(b, a->qp_num, dev.gid, cfg) == 0;
  }
  ~SrqPair() {
    buf.reset();
    if (a) ibv_destroy_qp(a);
    if (b) ibv_destroy_qp(b);
    if (srq) ibv_destroy_srq(srq);
    if (cq) ibv_destroy_cq(cq);
  }
  int post_srq(uint64_t wr_id) { return post_srq_recv(srq, wr_id, buf->sge(256, 64)); }
  // `n` unsignaled 8-byte SENDs from a to b.
  void send(int n) {
    ibv_sge sge = buf->sge(0, 8);
    for (int i = 0; i < n; ++i) {
      ibv_send_wr wr = make_wr(static_cast<uint64_t>(i), IBV_WR_SEND, &sge, 1, 0);
      ASSERT_EQ(post_send(a, wr), 0);
    }
  }

  Device dev;
  QpConfig cfg;
  ibv_srq* srq = nullptr;
  uint32_t granted = 0;
  ibv_cq* cq = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
  bool up = false;
  std::optional<Buffer> buf{std::in_place, dev.pd, 1024};
};

TEST(QueueDepth, SrqFillsUntilReceiveCompletionsArePolled) {
  SrqPair s;
  ASSERT_TRUE(s.up);
  EXPECT_EQ(s.granted, 3u);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s.post_srq(10 + i), 0);
  EXPECT_EQ(s.post_srq(19), ENOMEM);
  s.send(3);
  // Three receive completions wait in the CQ: the SRQ is still full.
  EXPECT_EQ(s.post_srq(20), ENOMEM);
  const auto wcs = poll_n(s.cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (const auto& wc : wcs) EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.post_srq(30 + i), 0);
  EXPECT_EQ(s.post_srq(39), ENOMEM);
}

// The SRQ WQEs that a QP's unpolled receive completions hold come back when
// the QP is reset or destroyed (its completions are cleaned away, or can no
// longer be tied to it), as mlx5's CQ cleaning frees them; otherwise the SRQ
// would lose those slots for good.
class SrqSlotsOfAGoneQp : public ::testing::TestWithParam<bool> {};

TEST_P(SrqSlotsOfAGoneQp, ComeBack) {
  const bool destroy = GetParam();
  SrqPair s;
  ASSERT_TRUE(s.up);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s.post_srq(10 + i), 0);
  s.send(3);
  ASSERT_EQ(s.post_srq(19), ENOMEM) << "three receive completions unpolled: the SRQ is full";
  if (destroy) {
    ASSERT_EQ(ibv_destroy_qp(s.b), 0);
    s.b = nullptr;
  } else {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(s.b, &attr, IBV_QP_STATE), 0);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.post_srq(20 + i), 0) << "slot " << i << " did not come back";
  EXPECT_EQ(s.post_srq(29), ENOMEM);
}

INSTANTIATE_TEST_SUITE_P(When, SrqSlotsOfAGoneQp, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Destroyed" : "Reset");
                         });

// ---------------------------------------------------------------------------
// Sizes as ConnectX grants them.

TEST(QueueSizes, CqHoldsOneMoreThanAskedRoundedToAPowerOfTwo) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const std::pair<int, int> cases[] = {{1, 1}, {2, 3}, {3, 3}, {4, 7}, {7, 7}, {8, 15}, {1000, 1023}};
  for (auto [asked, reported] : cases) {
    ibv_cq* cq = ibv_create_cq(dev.ctx, asked, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    EXPECT_EQ(cq->cqe, reported) << "cqe " << asked;
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
  ibv_cq* cq = ibv_create_cq(dev.ctx, 2, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_resize_cq(cq, 5), 0);
  EXPECT_EQ(cq->cqe, 7);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(QueueSizes, QpCapsSayWhatWasGranted) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 100;
  init.cap.max_recv_wr = 100;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(dev.pd, &init);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(init.cap.max_send_wr, 128u);
  EXPECT_EQ(init.cap.max_recv_wr, 128u);
  // The 64-byte WQE that one SGE needs has room for 28 inline bytes.
  EXPECT_EQ(init.cap.max_inline_data, 28u);
  const ibv_qp_cap queried = caps_of(qp);
  EXPECT_EQ(queried.max_send_wr, init.cap.max_send_wr);
  EXPECT_EQ(queried.max_recv_wr, init.cap.max_recv_wr);
  EXPECT_EQ(queried.max_inline_data, init.cap.max_inline_data);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// rdma_xclient's case: a 16-byte IBV_SEND_INLINE send on a QP created with
// max_inline_data 0 and one SGE, which ConnectX and rxe accept.
TEST(QueueSizes, InlineSendFitsTheRoomOfTheSgeWqe) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_sge = 1;
  cfg.max_inline_data = 0;
  QpPair pair(dev, cfg, 64);
  ASSERT_TRUE(pair.ok());
  Buffer dst(dev.pd, 64, Buffer::kAllAccess, 0);
  ibv_sge rsge = dst.sge(0, 64);
  ASSERT_EQ(post_recv(pair.b, 1, &rsge, 1), 0);
  char message[16] = "sixteen bytes!!";
  ibv_sge sge{reinterpret_cast<uint64_t>(message), sizeof message, 0};
  ibv_send_wr wr = make_wr(2, IBV_WR_SEND, &sge, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc;
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, sizeof message);
  EXPECT_EQ(std::memcmp(dst.data(), message, sizeof message), 0);
  // One byte past the granted room is refused at post.
  std::vector<char> big(caps_of(pair.a).max_inline_data + 1, 'x');
  ibv_sge big_sge{reinterpret_cast<uint64_t>(big.data()), static_cast<uint32_t>(big.size()), 0};
  ibv_send_wr too_big = make_wr(3, IBV_WR_SEND, &big_sge, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  EXPECT_EQ(post_send(pair.a, too_big), EINVAL);
}

TEST(QueueSizes, SrqKeepsOneSpareWqe) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const std::pair<uint32_t, uint32_t> cases[] = {{1, 1}, {4, 7}, {7, 7}, {8, 15}, {100, 127}};
  for (auto [asked, granted] : cases) {
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = asked;
    attr.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(dev.pd, &attr);
    ASSERT_NE(srq, nullptr);
    EXPECT_EQ(attr.attr.max_wr, granted) << "max_wr " << asked;
    ibv_srq_attr queried{};
    ASSERT_EQ(ibv_query_srq(srq, &queried), 0);
    EXPECT_EQ(queried.max_wr, granted);
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
  }
}

// ibv_modify_srq may grow max_wr up to the WQEs the SRQ was sized for (the
// power of two above what it granted, one kept spare), as on ConnectX, and no
// further: its ring, which has more slots than that (queue_sizes.hpp), does
// not move. What it grants, it then holds.
TEST(QueueSizes, SrqGrowsOnlyWithinItsSize) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_srq_init_attr init{};
  init.attr.max_wr = 4;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(dev.pd, &init);
  ASSERT_NE(srq, nullptr);
  ASSERT_EQ(init.attr.max_wr, 7u);
  ibv_srq_attr attr{};
  attr.max_wr = 8;
  EXPECT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
  attr.max_wr = 3;
  EXPECT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
  ibv_srq_attr queried{};
  ASSERT_EQ(ibv_query_srq(srq, &queried), 0);
  EXPECT_EQ(queried.max_wr, 3u);
  attr.max_wr = 7;
  EXPECT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
  Buffer buffer(dev.pd, 256);
  ASSERT_NE(buffer.mr(), nullptr);
  for (uint32_t i = 0; i < 7; ++i) ASSERT_EQ(post_srq_recv(srq, i, buffer.sge(0, 64)), 0) << "receive " << i;
  EXPECT_EQ(post_srq_recv(srq, 7, buffer.sge(0, 64)), ENOMEM);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

// The manual's multicast receiver (ch. 8): a UD QP on a CQ of 2 entries with 4
// receives posted, polled one completion at a time while messages arrive. On
// ConnectX the CQ holds 4, so it never overruns; neither does softhca's.
TEST(QueueSizes, FourReceivesOnACqOfTwoDoNotOverrun) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.type = IBV_QPT_UD;
  cfg.max_recv_wr = 4;
  QpPair pair(dev, cfg, 2);
  ASSERT_TRUE(pair.ok());
  ASSERT_EQ(pair.b_recv_cq->cqe, 3);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = dev.gid;
  ah_attr.grh.hop_limit = 64;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(dev.pd, &ah_attr);
  ASSERT_NE(ah, nullptr);
  {
    Buffer buf(dev.pd, 4096);
    ibv_sge rsge = buf.sge(1024, 128);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv(pair.b, static_cast<uint64_t>(i), &rsge, 1), 0);
    ibv_sge sge = buf.sge(0, 32);
    int received = 0;
    for (int i = 0; i < 40; ++i) {
      // A burst of four before polling anything, then one per completion.
      ibv_send_wr wr = make_wr(static_cast<uint64_t>(i), IBV_WR_SEND, &sge, 1);
      wr.wr.ud.ah = ah;
      wr.wr.ud.remote_qpn = pair.b->qp_num;
      wr.wr.ud.remote_qkey = cfg.qkey;
      ASSERT_EQ(post_send(pair.a, wr), 0);
      ibv_wc wc;
      ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
      if (i < 3) continue;
      ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc)) << "message " << received;
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
      ++received;
      ASSERT_EQ(post_recv(pair.b, 100 + static_cast<uint64_t>(i), &rsge, 1), 0);
    }
    EXPECT_EQ(poll_n(pair.b_recv_cq, 3).size(), 3u);
    // Every completion arrived, in order: the CQ never overran (an overrun
    // loses completions). No CQ_ERR is pending either.
    EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR?) was raised";
  }
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

}  // namespace
}  // namespace loopback

namespace loopback {
namespace {

long resident_kib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

// ibv_resize_cq used to keep every replaced ring until the CQ was destroyed:
// 20,000 resizes between 4096 and 8192 grew RSS to 2 GB and then failed with
// ENOMEM. A replaced ring is freed once no producer can be inside it.
TEST(CqResize, ReplacedRingsAreFreed) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4096, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_resize_cq(cq, 8192), 0);  // both ring sizes exist once before measuring
  ASSERT_EQ(ibv_resize_cq(cq, 4096), 0);
  const long before = resident_kib();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ibv_resize_cq(cq, (i & 1) ? 4096 : 8192), 0) << "resize " << i;
  const long grown_kib = resident_kib() - before;
  // 1,000 leaked rings would be some 750 MB; what remains is a few rings at most.
  EXPECT_LT(grown_kib, 64 * 1024) << "RSS grew by " << grown_kib << " KiB";
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Resize while another thread keeps pushing completions into the CQ: every
// completion arrives once, in order, whichever ring it was pushed into.
TEST(CqResize, WhileCompletionsKeepArriving) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_recv_wr = 256;
  cfg.max_send_wr = 64;
  QpPair pair(dev, cfg, 512);
  ASSERT_TRUE(pair.ok());
  constexpr uint32_t kMessages = 5000;
  Buffer buf(dev.pd, 4096);
  ibv_sge rsge = buf.sge(2048, 64);
  uint32_t posted = 0;
  while (posted < 256) ASSERT_EQ(post_recv(pair.b, posted++, &rsge, 1), 0);
  std::atomic<bool> sender_ok{true};
  std::thread sender([&] {
    ibv_sge sge = buf.sge(0, 8);
    uint32_t outstanding = 0;
    ibv_wc wc[16];
    for (uint32_t i = 0; i < kMessages && sender_ok; ++i) {
      ibv_send_wr wr = make_wr(i, IBV_WR_SEND_WITH_IMM, &sge, 1);
      wr.imm_data = htonl(i);
      while (outstanding >= 64) {
        const int got = ibv_poll_cq(pair.a_send_cq, 16, wc);
        if (got < 0) sender_ok = false;
        for (int k = 0; k < got; ++k)
          if (wc[k].status != IBV_WC_SUCCESS) sender_ok = false;
        outstanding -= static_cast<uint32_t>(got > 0 ? got : 0);
        if (!sender_ok) return;
      }
      if (post_send(pair.a, wr) != 0) {
        sender_ok = false;
        return;
      }
      ++outstanding;
    }
    const auto rest = poll_n(pair.a_send_cq, outstanding, Millis{20000});
    if (rest.size() != outstanding) sender_ok = false;
  });
  uint32_t received = 0;
  int resizes = 0;
  const auto until = Clock::now() + Millis{30000};
  ibv_wc wc[32];
  while (received < kMessages && Clock::now() < until && sender_ok) {
    ASSERT_EQ(ibv_resize_cq(pair.b_recv_cq, (resizes++ & 1) ? 300 : 600), 0);
    const int got = ibv_poll_cq(pair.b_recv_cq, 32, wc);
    ASSERT_GE(got, 0);
    for (int k = 0; k < got; ++k) {
      ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS) << wc_str(wc[k]);
      ASSERT_EQ(ntohl(wc[k].imm_data), received) << "completion lost, repeated or out of order";
      ++received;
      if (posted < kMessages) {
        ASSERT_EQ(post_recv(pair.b, posted++, &rsge, 1), 0);
      }
    }
  }
  sender.join();
  EXPECT_TRUE(sender_ok.load());
  EXPECT_EQ(received, kMessages);
  EXPECT_GT(resizes, 10);
  // All 5000 arrived in order, so the CQ never overran; and no CQ_ERR is pending.
  EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR?) was raised";
}

// Resize the send CQ while another thread of the process posts signaled
// WRITEs on a QP completing into it and polls them. Those completions are
// pushed under the thread's access announcement, not counted as producers:
// the resize frees a replaced ring only after fencing the announcements. A
// producer left inside a freed ring would write into whatever the segment
// put there next (often the next ring): completions lost, repeated or out
// of order.
TEST(CqResize, WhileItsOwnQpsCompleteWrites) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 64;
  QpPair pair(dev, cfg, 512);
  ASSERT_TRUE(pair.ok());
  constexpr uint64_t kWrites = 5000;
  Buffer buf(dev.pd, 4096);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> completed{0};
  std::string failure;  // the sender's, read after join
  std::thread sender([&] {
    ibv_sge sge = buf.sge(0, 8);
    uint64_t posted = 0;
    ibv_wc wc[16];
    const auto until = Clock::now() + Millis{30000};
    while (completed.load(std::memory_order_relaxed) < kWrites && Clock::now() < until) {
      while (posted < kWrites && posted - completed.load(std::memory_order_relaxed) < 64) {
        ibv_send_wr wr = write_wr(buf, sge, posted, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        if (post_send(pair.a, wr) != 0) {
          failure = "post_send failed at " + std::to_string(posted);
          done = true;
          return;
        }
        ++posted;
      }
      const int got = ibv_poll_cq(pair.a_send_cq, 16, wc);
      for (int k = 0; k < got; ++k) {
        const uint64_t expected = completed.load(std::memory_order_relaxed);
        if (wc[k].status != IBV_WC_SUCCESS || wc[k].wr_id != expected) {
          failure = "completion " + std::to_string(expected) + ": " + wc_str(wc[k]);
          done = true;
          return;
        }
        completed.store(expected + 1, std::memory_order_relaxed);
      }
      if (got < 0) {
        failure = "ibv_poll_cq failed";
        break;
      }
    }
    done = true;
  });
  int resizes = 0;
  while (!done.load()) ASSERT_EQ(ibv_resize_cq(pair.a_send_cq, (resizes++ & 1) ? 300 : 600), 0);
  sender.join();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(completed.load(), kWrites) << "completions lost";
  EXPECT_GT(resizes, 10);
  EXPECT_FALSE(fd_readable(dev.ctx->async_fd, Millis{0})) << "an async event (CQ_ERR?) was raised";
}

}  // namespace
}  // namespace loopback
