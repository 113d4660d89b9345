// Errors as hardware reports them: completion statuses at the requester and the
// responder, the responder's async event and ERROR state, flushes of everything
// outstanding, RNR and transport retry exhaustion (bounded in time); then the
// errno each verb returns for bad input.
#include <sys/mman.h>
#include <unistd.h>

#include "loopback.hpp"

namespace loopback {
namespace {

// ---------------------------------------------------------------------------
// 3. Data-path errors.

TEST(RcError, BadLkeyIsLocalProtectionError) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 64);
  Buffer dst(dev.pd, 64);
  ibv_sge rsge = dst.sge(0, 64);
  ASSERT_EQ(post_recv(pair.b, 1, &rsge, 1), 0);
  ibv_sge sge = src.sge(0, 64);
  sge.lkey ^= 0x5A5A00;  // no such MR
  ibv_send_wr wr = make_wr(5, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.qp_num, pair.a->qp_num);
  EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
  // Nothing reached the responder, which stays up.
  EXPECT_TRUE(stays_empty(pair.b_recv_cq, Millis{5}));
  EXPECT_EQ(qp_state(pair.b), IBV_QPS_RTS);
}

TEST(RcError, SgeOutsideItsMrIsLocalProtectionError) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 64);
  Buffer dst(dev.pd, 64);
  ibv_sge sge = src.sge(32, 64);  // runs 32 bytes past the MR
  ibv_send_wr wr = make_wr(5, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = dst.addr();
  wr.wr.rdma.rkey = dst.rkey();
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
}

// A remote access violation: the requester gets REM_ACCESS_ERR, the responder
// QP moves to ERROR with IBV_EVENT_QP_ACCESS_ERR and flushes its receives.
enum class Violation {
  kWriteBadRkey,
  kWriteOutOfRange,
  kReadBadRkey,
  kReadOutOfRange,
  kWriteMrNoRemoteWrite,
  kReadMrNoRemoteRead,
  kWriteQpNoRemoteWrite,
  kReadQpNoRemoteRead,
  kWriteMrOtherPd,
  kReadMrOtherPd,
};

const char* violation_name(Violation v) {
  switch (v) {
    case Violation::kWriteBadRkey: return "WriteBadRkey";
    case Violation::kWriteOutOfRange: return "WriteOutOfRange";
    case Violation::kReadBadRkey: return "ReadBadRkey";
    case Violation::kReadOutOfRange: return "ReadOutOfRange";
    case Violation::kWriteMrNoRemoteWrite: return "WriteMrNoRemoteWrite";
    case Violation::kReadMrNoRemoteRead: return "ReadMrNoRemoteRead";
    case Violation::kWriteQpNoRemoteWrite: return "WriteQpNoRemoteWrite";
    case Violation::kReadQpNoRemoteRead: return "ReadQpNoRemoteRead";
    case Violation::kWriteMrOtherPd: return "WriteMrOtherPd";
    case Violation::kReadMrOtherPd: return "ReadMrOtherPd";
  }
  return "?";
}

class RemoteAccess : public ::testing::TestWithParam<Violation> {};

TEST_P(RemoteAccess, RequesterRemAccessErrResponderQpAccessErr) {
  const Violation v = GetParam();
  const bool is_read = v == Violation::kReadBadRkey || v == Violation::kReadOutOfRange ||
                       v == Violation::kReadMrNoRemoteRead || v == Violation::kReadQpNoRemoteRead ||
                       v == Violation::kReadMrOtherPd;
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg_b;
  if (v == Violation::kWriteQpNoRemoteWrite) cfg_b.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  if (v == Violation::kReadQpNoRemoteRead) cfg_b.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  QpPair pair(dev, QpConfig{}, cfg_b);
  ASSERT_TRUE(pair.ok());

  int access = Buffer::kAllAccess;
  if (v == Violation::kWriteMrNoRemoteWrite) access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  if (v == Violation::kReadMrNoRemoteRead) access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_pd* other_pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other_pd, nullptr);
  const bool other = v == Violation::kWriteMrOtherPd || v == Violation::kReadMrOtherPd;
  {
    Buffer remote(other ? other_pd : dev.pd, 256, access, 0x33);
    Buffer local(dev.pd, 256, Buffer::kAllAccess, 0x44);
    ASSERT_NE(remote.mr(), nullptr);
    // The responder has receives posted: they are flushed when it fails.
    Buffer rbuf(dev.pd, 64);
    ibv_sge rsge = rbuf.sge(0, 64);
    ASSERT_EQ(post_recv(pair.b, 100, &rsge, 1), 0);
    ASSERT_EQ(post_recv(pair.b, 101, &rsge, 1), 0);

    ibv_sge sge = local.sge(0, 128);
    ibv_send_wr wr = make_wr(77, is_read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = remote.addr();
    wr.wr.rdma.rkey = remote.rkey();
    if (v == Violation::kWriteBadRkey || v == Violation::kReadBadRkey) wr.wr.rdma.rkey ^= 0x777700;
    if (v == Violation::kWriteOutOfRange || v == Violation::kReadOutOfRange) wr.wr.rdma.remote_addr = remote.addr(200);
    ASSERT_EQ(post_send(pair.a, wr), 0);

    ibv_wc wc{};
    ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, 77u);
    EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);

    decltype(ibv_async_event::element) element{};
    ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, &element)) << "no QP_ACCESS_ERR event";
    EXPECT_EQ(element.qp, pair.b);
    EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
    auto flushed = poll_n(pair.b_recv_cq, 2);
    ASSERT_EQ(flushed.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(flushed[i].status, IBV_WC_WR_FLUSH_ERR) << wc_str(flushed[i]);
      EXPECT_EQ(flushed[i].wr_id, 100 + i);
      EXPECT_EQ(flushed[i].qp_num, pair.b->qp_num);
    }
    // Neither side's memory changed.
    EXPECT_EQ(first_not(remote.span(0, 256), 0x33), -1);
    EXPECT_EQ(first_not(local.span(0, 256), 0x44), -1);
  }
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Violations, RemoteAccess,
    ::testing::Values(Violation::kWriteBadRkey, Violation::kWriteOutOfRange, Violation::kReadBadRkey,
                      Violation::kReadOutOfRange, Violation::kWriteMrNoRemoteWrite, Violation::kReadMrNoRemoteRead,
                      Violation::kWriteQpNoRemoteWrite, Violation::kReadQpNoRemoteRead, Violation::kWriteMrOtherPd,
                      Violation::kReadMrOtherPd),
    [](const ::testing::TestParamInfo<Violation>& info) { return violation_name(info.param); });

TEST(RcError, SendLongerThanReceiveIsInvalidRequestAndLocalLength) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 64);
  Buffer dst(dev.pd, 64);
  ibv_sge rsge = dst.sge(0, 16);
  ASSERT_EQ(post_recv(pair.b, 11, &rsge, 1), 0);
  ibv_sge sge = src.sge(0, 64);
  ibv_send_wr wr = make_wr(12, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 12u);
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 11u);
  EXPECT_EQ(wc.qp_num, pair.b->qp_num);
  EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
  const auto until = Clock::now() + kDeadline;
  while (qp_state(pair.b) != IBV_QPS_ERR && Clock::now() < until) {
  }
  EXPECT_EQ(qp_state(pair.b), IBV_QPS_ERR);
}

// After the first error, every outstanding WR completes with WR_FLUSH_ERR, in
// order: the rest of the send queue, the receive queue, and WRs posted later.
TEST(RcError, EverythingOutstandingIsFlushed) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 256);
  ibv_sge rsge = buf.sge(128, 64);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv(pair.a, 200 + i, &rsge, 1), 0);

  ibv_sge bad = buf.sge(0, 16);
  bad.lkey ^= 0x123400;
  ibv_sge good = buf.sge(0, 16);
  ibv_send_wr wrs[4] = {make_wr(1, IBV_WR_RDMA_WRITE, &bad, 1), make_wr(2, IBV_WR_RDMA_WRITE, &good, 1),
                        make_wr(3, IBV_WR_SEND, &good, 1), make_wr(4, IBV_WR_RDMA_READ, &good, 1)};
  for (int i = 0; i < 4; ++i) {
    wrs[i].wr.rdma.remote_addr = buf.addr(64);
    wrs[i].wr.rdma.rkey = buf.rkey();
    wrs[i].next = i < 3 ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad_wr = nullptr;
  ASSERT_EQ(ibv_post_send(pair.a, &wrs[0], &bad_wr), 0);
  auto wcs = poll_n(pair.a_send_cq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR) << wc_str(wcs[0]);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(wcs[i].wr_id, uint64_t(i + 1));
    EXPECT_EQ(wcs[i].qp_num, pair.a->qp_num);
    if (i > 0) {
      EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << wc_str(wcs[i]);
    }
  }
  auto rwcs = poll_n(pair.a_recv_cq, 3);
  ASSERT_EQ(rwcs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rwcs[i].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(rwcs[i].wr_id, uint64_t(200 + i));
  }
  // Posted in ERROR: accepted, and flushed.
  ibv_send_wr later = make_wr(9, IBV_WR_SEND, &good, 1);
  EXPECT_EQ(post_send(pair.a, later), 0);
  EXPECT_EQ(post_recv(pair.a, 300, &rsge, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_TRUE(poll_one(pair.a_recv_cq, &wc));
  EXPECT_EQ(wc.wr_id, 300u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{2}));
  // Nothing went through to b.
  EXPECT_TRUE(stays_empty(pair.b_recv_cq, Millis{2}));
}

// Moving a QP to ERROR by hand flushes both queues too.
TEST(RcError, ModifyToErrorFlushes) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 7;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  ASSERT_EQ(post_recv(pair.a, 50, &sge, 1), 0);
  // b has no receive: a's SENDs wait in RNR.
  ibv_send_wr w1 = make_wr(1, IBV_WR_SEND, &sge, 1), w2 = make_wr(2, IBV_WR_SEND, &sge, 1);
  w1.next = &w2;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(pair.a, &w1, &bad), 0);
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{20}));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(pair.a, &attr, IBV_QP_STATE), 0);
  auto wcs = poll_n(pair.a_send_cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_recv_cq, &wc));
  EXPECT_EQ(wc.wr_id, 50u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

// RNR: no receive at the responder. rnr_retry N (< 7) gives up after N retries.
class RnrRetry : public ::testing::TestWithParam<int> {};

TEST_P(RnrRetry, ExhaustedWithoutReceive) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = static_cast<uint8_t>(GetParam());
  cfg.min_rnr_timer = 1;  // 10 us
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 32);
  ibv_send_wr wr = make_wr(3, IBV_WR_SEND, &sge, 1);
  const auto start = Clock::now();
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc)) << "RNR retries never ended";
  EXPECT_LT(Clock::now() - start, Millis{2000});
  EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
  // An RNR NAK is not an error at the responder.
  EXPECT_EQ(qp_state(pair.b), IBV_QPS_RTS);
}

INSTANTIATE_TEST_SUITE_P(Counts, RnrRetry, ::testing::Values(0, 1, 2, 3));

// The same for WRITE_WITH_IMM, which needs a receive WQE too.
TEST(RnrRetryImm, WriteWithImmExhausted) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 1;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 64, Buffer::kAllAccess, 0x5C);
  ibv_sge sge = buf.sge(0, 8);
  ibv_send_wr wr = make_wr(3, IBV_WR_RDMA_WRITE_WITH_IMM, &sge, 1);
  wr.wr.rdma.remote_addr = buf.addr(32);
  wr.wr.rdma.rkey = buf.rkey();
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << wc_str(wc);
}

// rnr_retry 7 retries forever: a receive posted later lets the SEND through.
TEST(RnrRetryInfinite, SucceedsOnceReceiveIsPosted) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 7;
  cfg.min_rnr_timer = 1;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 64);
  Buffer dst(dev.pd, 64);
  fill_pattern(src.span(0, 64), 9);
  ibv_sge sge = src.sge(0, 64);
  ibv_send_wr wr = make_wr(4, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  // Far longer than many RNR timer periods: still waiting, no error.
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{100}));
  ibv_sge rsge = dst.sge(0, 64);
  ASSERT_EQ(post_recv(pair.b, 8, &rsge, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 64u);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), 64), 0);
}

// The RNR retry also runs while the application does not poll (progress thread).
TEST(RnrRetryInfinite, CompletesWithoutPollingMeanwhile) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.rnr_retry = 7;
  cfg.min_rnr_timer = 1;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  ibv_send_wr wr = make_wr(4, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_sge rsge = buf.sge(32, 8);
  ASSERT_EQ(post_recv(pair.b, 8, &rsge, 1), 0);
  // Wait on the receive side only: the parked SEND must be retried by itself.
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// No responder at all: the transport timeout expires retry_cnt + 1 times.
class TransportRetry : public ::testing::TestWithParam<int> {};

TEST_P(TransportRetry, DestroyedRemoteQpIsRetryExceeded) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.timeout = static_cast<uint8_t>(GetParam());
  cfg.retry_cnt = 1;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  pair.destroy_b();
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 16);
  ibv_send_wr wr = make_wr(6, IBV_WR_SEND, &sge, 1);
  const auto start = Clock::now();
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc)) << "transport retries never ended";
  EXPECT_LT(Clock::now() - start, Millis{2000});
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 6u);
  EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
}

TEST_P(TransportRetry, NoSuchDestQpnIsRetryExceeded) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.timeout = static_cast<uint8_t>(GetParam());
  cfg.retry_cnt = 1;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(bring_up(qp, 0xFFFFF0, dev.gid, cfg), 0);
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 16);
  ibv_send_wr wr = make_wr(6, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = buf.addr(32);
  wr.wr.rdma.rkey = buf.rkey();
  const auto start = Clock::now();
  ASSERT_EQ(post_send(qp, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(cq, &wc)) << "transport retries never ended";
  EXPECT_LT(Clock::now() - start, Millis{2000});
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

INSTANTIATE_TEST_SUITE_P(Timeouts, TransportRetry, ::testing::Values(1, 2, 3, 4));

// ---------------------------------------------------------------------------
// 4. Verb errnos.

class PostSendBeforeRts : public ::testing::TestWithParam<ibv_qp_state> {};

TEST_P(PostSendBeforeRts, IsEinvalWithBadWr) {
  const ibv_qp_state state = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  QpConfig cfg;
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  if (state >= IBV_QPS_INIT) {
    ASSERT_EQ(qp_to_init(qp, cfg), 0);
  }
  if (state >= IBV_QPS_RTR) {
    ASSERT_EQ(qp_to_rtr(qp, qp->qp_num, dev.gid, cfg), 0);
  }
  ASSERT_EQ(qp_state(qp), state);
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  ibv_send_wr w1 = make_wr(1, IBV_WR_SEND, &sge, 1), w2 = make_wr(2, IBV_WR_SEND, &sge, 1);
  w1.next = &w2;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &w1, &bad), EINVAL);
  EXPECT_EQ(bad, &w1);
  EXPECT_TRUE(stays_empty(cq, Millis{2}));
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

INSTANTIATE_TEST_SUITE_P(States, PostSendBeforeRts, ::testing::Values(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR),
                         [](const ::testing::TestParamInfo<ibv_qp_state>& info) {
                           return std::string(info.param == IBV_QPS_RESET  ? "Reset"
                                              : info.param == IBV_QPS_INIT ? "Init"
                                                                           : "Rtr");
                         });

TEST(VerbErrno, PostRecvInResetIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, QpConfig{});
  ASSERT_NE(qp, nullptr);
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
}

TEST(VerbErrno, TooManySgesIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_sge = 2;
  cfg.max_recv_sge = 2;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(pair.a, &attr, IBV_QP_CAP, &init), 0);
  Buffer buf(dev.pd, 4096);
  std::vector<ibv_sge> sges(init.cap.max_send_sge + 1, buf.sge(0, 8));
  ibv_send_wr ok = make_wr(1, IBV_WR_SEND, sges.data(), 1);
  ibv_send_wr wr = make_wr(2, IBV_WR_SEND, sges.data(), static_cast<int>(sges.size()));
  ok.next = &wr;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(pair.a, &ok, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);  // the first WR was posted, the second not
  std::vector<ibv_sge> rsges(init.cap.max_recv_sge + 1, buf.sge(0, 8));
  ibv_recv_wr rwr{};
  rwr.sg_list = rsges.data();
  rwr.num_sge = static_cast<int>(rsges.size());
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(pair.b, &rwr, &rbad), EINVAL);
  EXPECT_EQ(rbad, &rwr);
}

TEST(VerbErrno, SendQueueOverCapacityIsEnomem) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 8;
  cfg.rnr_retry = 7;  // b posts no receive: every SEND stays outstanding
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.a).max_send_wr;
  ASSERT_GE(depth, 8u);
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  for (uint32_t i = 0; i < depth; ++i) {
    ibv_send_wr wr = make_wr(i, IBV_WR_SEND, &sge, 1);
    ASSERT_EQ(post_send(pair.a, wr), 0) << "WR " << i << " of " << depth;
  }
  ibv_send_wr wr = make_wr(99, IBV_WR_SEND, &sge, 1);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(pair.a, &wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr);
  // Tear down: ERROR flushes them all.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(pair.a, &attr, IBV_QP_STATE), 0);
  auto wcs = poll_n(pair.a_send_cq, depth);
  EXPECT_EQ(wcs.size(), depth);
}

TEST(VerbErrno, ReceiveQueueOverCapacityIsEnomem) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_recv_wr = 8;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  const uint32_t depth = caps_of(pair.b).max_recv_wr;
  ASSERT_GE(depth, 8u);
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  for (uint32_t i = 0; i < depth; ++i) ASSERT_EQ(post_recv(pair.b, i, &sge, 1), 0) << i;
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(pair.b, &wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr);
  // One consumed: room for one more.
  ibv_send_wr send = make_wr(1, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, send), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
  EXPECT_EQ(ibv_post_recv(pair.b, &wr, &bad), 0);
}

TEST(VerbErrno, ModifyQpWithWrongMaskIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  QpConfig cfg;
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr attr{};
  // RESET -> INIT without the access flags.
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  // RESET -> RTR: no such transition.
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(qp_state(qp), IBV_QPS_RESET);
  ASSERT_EQ(qp_to_init(qp, cfg), 0);
  // INIT -> RTR without DEST_QPN.
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_1024;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = dev.gid;
  attr.ah_attr.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &attr,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                              IBV_QP_MIN_RNR_TIMER),
            EINVAL);
  // INIT -> INIT with an attribute INIT does not take (the timeout).
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.timeout = 14;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);
  ASSERT_EQ(qp_to_rtr(qp, qp->qp_num, dev.gid, cfg), 0);
  // RTR -> RTS without the requester's timers.
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN), EINVAL);
  EXPECT_EQ(qp_state(qp), IBV_QPS_RTR);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(VerbErrno, DeallocPdWithMrIsEbusy) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  std::vector<uint8_t> mem(4096);
  ibv_mr* mr = ibv_reg_mr(pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST(VerbErrno, DeallocPdWithQpIsEbusy) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ibv_qp* qp = create_qp(pd, cq, cq, QpConfig{});
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(VerbErrno, DestroyCqWithQpIsEbusy) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_cq* scq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ibv_qp* qp = create_qp(dev.pd, scq, rcq, QpConfig{});
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(scq), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(rcq), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(scq), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

TEST(VerbErrno, DestroyCompChannelWithCqIsEbusy) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* ch = ibv_create_comp_channel(dev.ctx);
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST(VerbErrno, RegMrRemoteWriteWithoutLocalWriteIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> mem(4096);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(dev.pd, mem.data(), mem.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(dev.pd, mem.data(), mem.size(), IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // REMOTE_READ alone is fine.
  ibv_mr* mr = ibv_reg_mr(dev.pd, mem.data(), mem.size(), IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST(VerbErrno, RegMrRelaxedOrderingIsAccepted) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> mem(4096);
  // Through the ibv_reg_mr macro with a non-constant access (ibv_reg_mr_iova2) and with a constant one.
  volatile int dynamic = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING;
  ibv_mr* mr = ibv_reg_mr(dev.pd, mem.data(), mem.size(), dynamic);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  mr = ibv_reg_mr(dev.pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST(VerbErrno, CreateAhWithoutGrhIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_ah_attr attr{};
  attr.is_global = 0;
  attr.dlid = 1;
  attr.port_num = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(dev.pd, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // With a GRH it works.
  attr.is_global = 1;
  attr.grh.dgid = dev.gid;
  attr.grh.sgid_index = 0;
  attr.grh.hop_limit = 1;
  ibv_ah* ah = ibv_create_ah(dev.pd, &attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dealloc_pd(dev.pd), EBUSY);  // the AH holds the PD
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST(VerbErrno, CreateQpBeyondLimitsIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr dattr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &dattr), 0);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  QpConfig cfg;
  cfg.max_send_wr = static_cast<uint32_t>(dattr.max_qp_wr) + 1;
  errno = 0;
  EXPECT_EQ(create_qp(dev.pd, cq, cq, cfg), nullptr);
  EXPECT_EQ(errno, EINVAL);
  cfg = QpConfig{};
  cfg.max_send_sge = static_cast<uint32_t>(dattr.max_sge) + 1;
  errno = 0;
  EXPECT_EQ(create_qp(dev.pd, cq, cq, cfg), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}


// ---------------------------------------------------------------------------
// Registration of memory that is not there: the kernel pins the pages and
// fails with EFAULT (EINVAL for a range that wraps), so ibv_reg_mr never
// hands out an MR whose first use would fault.

// Pages mapped for one test: three pages PROT_NONE, re-protected as needed.
// Pages the test unmaps are forgotten, so the destructor never unmaps
// something else that took their place.
class Pages {
 public:
  Pages() : page_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    void* mem = ::mmap(nullptr, 3 * page_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = mem == MAP_FAILED ? nullptr : static_cast<uint8_t*>(mem);
  }
  ~Pages() {
    for (int n = 0; n < 3; ++n)
      if (base_ != nullptr && mapped_[n]) ::munmap(page(n), page_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  bool ok() const { return base_ != nullptr; }
  bool protect(int prot) { return ::mprotect(base_, 3 * page_, prot) == 0; }
  bool unmap(int first, int count) {
    for (int n = first; n < first + count; ++n) mapped_[n] = false;
    return ::munmap(page(first), static_cast<size_t>(count) * page_) == 0;
  }
  uint8_t* page(int n) const { return base_ + static_cast<size_t>(n) * page_; }
  size_t size() const { return 3 * page_; }
  size_t page_size() const { return page_; }

 private:
  size_t page_;
  uint8_t* base_ = nullptr;
  bool mapped_[3] = {true, true, true};
};

constexpr int kWriteAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

// Asserts that every registration verb refuses [addr, addr + length) with `err`.
void expect_reg_mr_fails(ibv_pd* pd, void* addr, size_t length, int access, int err) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, addr, length, access), nullptr);
  EXPECT_EQ(errno, err);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr_iova(pd, addr, length, 0x1000, access), nullptr);
  EXPECT_EQ(errno, err);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr_iova2(pd, addr, length, 0x1000, static_cast<unsigned>(access)), nullptr);
  EXPECT_EQ(errno, err);
}

// Whether all of [addr, addr + length) is mapped now (mincore fails with
// ENOMEM on an unmapped page).
bool all_mapped(void* addr, size_t length) {
  std::vector<unsigned char> residency((length + 4095) / 4096 + 1);
  return ::mincore(addr, length, residency.data()) == 0;
}

// Like expect_reg_mr_fails with EFAULT, for a range with a hole [hole,
// hole + hole_length) that this test unmapped. Another thread (the
// sanitizers' allocators, softhca's own) may map something into a fresh hole
// at any moment, and then the registration rightly succeeds: that attempt is
// void and the caller tries again with a new hole (returns false). A
// registration that succeeds while the hole is still unmapped fails the test.
bool refused_unless_refilled(ibv_pd* pd, void* addr, size_t length, int access, void* hole, size_t hole_length) {
  for (int verb = 0; verb < 3; ++verb) {
    errno = 0;
    ibv_mr* mr = verb == 0   ? ibv_reg_mr(pd, addr, length, access)
                 : verb == 1 ? ibv_reg_mr_iova(pd, addr, length, 0x1000, access)
                             : ibv_reg_mr_iova2(pd, addr, length, 0x1000, static_cast<unsigned>(access));
    if (mr == nullptr) {
      EXPECT_EQ(errno, EFAULT) << "verb " << verb;
      continue;
    }
    const bool refilled = all_mapped(hole, hole_length);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    EXPECT_TRUE(refilled) << "verb " << verb << " registered a range with unmapped pages";
    return false;
  }
  return true;
}

TEST(VerbErrno, RegMrOfJustUnmappedMemoryIsEfault) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  for (int attempt = 0; attempt < 20; ++attempt) {
    Pages pages;
    ASSERT_TRUE(pages.ok());
    ASSERT_TRUE(pages.protect(PROT_READ | PROT_WRITE));
    ibv_mr* mr = ibv_reg_mr(dev.pd, pages.page(0), pages.size(), kWriteAccess);
    ASSERT_NE(mr, nullptr) << std::strerror(errno);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    ASSERT_TRUE(pages.unmap(0, 3));
    if (refused_unless_refilled(dev.pd, pages.page(0), pages.size(), kWriteAccess, pages.page(0), pages.size()) &&
        refused_unless_refilled(dev.pd, pages.page(1), 1, 0, pages.page(1), 1))
      return;
  }
  GTEST_SKIP() << "something else mapped memory into every fresh hole";
}

TEST(VerbErrno, RegMrOfProtNoneReservationIsEfault) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  Pages pages;
  ASSERT_TRUE(pages.ok());
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), kWriteAccess, EFAULT);
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), IBV_ACCESS_REMOTE_READ, EFAULT);
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), 0, EFAULT);
}

TEST(VerbErrno, RegMrOfPartlyUnmappedRangeIsEfault) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  for (int attempt = 0; attempt < 20; ++attempt) {
    Pages pages;
    ASSERT_TRUE(pages.ok());
    ASSERT_TRUE(pages.protect(PROT_READ | PROT_WRITE));
    ASSERT_TRUE(pages.unmap(1, 1));  // a hole in the middle
    const size_t page = pages.page_size();
    if (!refused_unless_refilled(dev.pd, pages.page(0), pages.size(), kWriteAccess, pages.page(1), page) ||
        !refused_unless_refilled(dev.pd, pages.page(0), page + 1, IBV_ACCESS_REMOTE_READ, pages.page(1), page))
      continue;  // the hole was refilled meanwhile: a new one
    // The pages either side of the hole register alone.
    for (int n : {0, 2}) {
      ibv_mr* mr = ibv_reg_mr(dev.pd, pages.page(n), page, kWriteAccess);
      ASSERT_NE(mr, nullptr) << std::strerror(errno);
      EXPECT_EQ(ibv_dereg_mr(mr), 0);
    }
    return;
  }
  GTEST_SKIP() << "something else mapped memory into every fresh hole";
}

TEST(VerbErrno, RegMrOfReadOnlyMemoryWithWriteAccessIsEfault) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  Pages pages;
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(pages.protect(PROT_READ));
  // Local write, and remote write/atomic (which imply it), need writable pages.
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), IBV_ACCESS_LOCAL_WRITE, EFAULT);
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), kWriteAccess, EFAULT);
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
                      EFAULT);
  // One read-only page among writable ones is enough.
  ASSERT_EQ(::mprotect(pages.page(0), pages.page_size(), PROT_READ | PROT_WRITE), 0);
  expect_reg_mr_fails(dev.pd, pages.page(0), pages.size(), IBV_ACCESS_LOCAL_WRITE, EFAULT);
}

TEST(VerbErrno, RegMrWrappingTheAddressSpaceIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  auto* top = reinterpret_cast<void*>(UINTPTR_MAX - 0xfff);
  expect_reg_mr_fails(dev.pd, top, 0x2000, IBV_ACCESS_LOCAL_WRITE, EINVAL);
  expect_reg_mr_fails(dev.pd, top, 0x2000, 0, EINVAL);
}

// PROT_READ memory registered without write access is what a kernel accepts,
// and a peer's RDMA READ from it returns its bytes.
TEST(VerbErrno, RegMrOfReadOnlyMemoryForRemoteReadWorks) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  Pages pages;
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(pages.protect(PROT_READ | PROT_WRITE));
  fill_pattern({pages.page(0), pages.size()}, 42);
  ASSERT_TRUE(pages.protect(PROT_READ));
  ibv_mr* none = ibv_reg_mr(dev.pd, pages.page(0), pages.size(), 0);
  ASSERT_NE(none, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(none), 0);
  ibv_mr* ro = ibv_reg_mr(dev.pd, pages.page(0), pages.size(), IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(ro, nullptr) << std::strerror(errno);

  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer dst(dev.pd, pages.size());
  ASSERT_NE(dst.mr(), nullptr);
  ibv_sge sge = dst.sge(0, static_cast<uint32_t>(pages.size()));
  ibv_send_wr wr = make_wr(7, IBV_WR_RDMA_READ, &sge, 1);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(pages.page(0));
  wr.wr.rdma.rkey = ro->rkey;
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(dst.span(0, pages.size()), {pages.page(0), pages.size()}), -1);
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
}

TEST(VerbErrno, ReregMrToMemoryThatIsNotThereFailsAndKeepsTheMr) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> mem(4096);
  ibv_mr* mr = ibv_reg_mr(dev.pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  const uint32_t lkey = mr->lkey;
  Pages pages;
  ASSERT_TRUE(pages.ok());
  // What the provider refuses is IBV_REREG_MR_ERR_CMD, errno saying why (rdma-core's convention).
  const auto rereg = [&](int flags, void* addr, size_t length, int access, int expected_errno) {
    errno = 0;
    EXPECT_EQ(ibv_rereg_mr(mr, flags, nullptr, addr, length, access), IBV_REREG_MR_ERR_CMD);
    EXPECT_EQ(errno, expected_errno) << std::strerror(errno);
  };
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION, pages.page(0), pages.size(), 0, EFAULT);
  ASSERT_TRUE(pages.protect(PROT_READ));
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION, pages.page(0), pages.size(), 0, EFAULT);
  rereg(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, pages.page(0), pages.size(),
        IBV_ACCESS_LOCAL_WRITE, EFAULT);
  // Read-only memory with read-only access moves; asking for write access on it then fails.
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, nullptr, pages.page(0),
                         pages.size(), IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_EQ(mr->addr, pages.page(0));
  rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, 0, IBV_ACCESS_LOCAL_WRITE, EFAULT);
  EXPECT_EQ(mr->lkey, lkey);
  EXPECT_EQ(mr->addr, pages.page(0));
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}


// The device's object limits are what creating objects meets: max_cq CQs,
// max_srq SRQs and max_pd PDs can be held (these count per process), and the
// next create fails with ENOMEM, as on a device at its limit.
TEST(VerbErrno, CreateCqBeyondMaxCqIsEnomem) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  std::vector<ibv_cq*> cqs;
  cqs.reserve(static_cast<size_t>(attr.max_cq));
  for (int i = 0; i < attr.max_cq; ++i) {
    ibv_cq* cq = ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr) << "cq " << i << ": " << std::strerror(errno);
    cqs.push_back(cq);
  }
  errno = 0;
  EXPECT_EQ(ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ASSERT_EQ(ibv_destroy_cq(cqs.back()), 0);
  cqs.back() = ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0);  // a destroyed CQ frees its place
  EXPECT_NE(cqs.back(), nullptr) << std::strerror(errno);
  for (ibv_cq* cq : cqs) {
    if (cq) {
      EXPECT_EQ(ibv_destroy_cq(cq), 0);
    }
  }
}

TEST(VerbErrno, CreateSrqBeyondMaxSrqIsEnomem) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  ibv_srq_init_attr init{};
  init.attr.max_wr = 1;
  init.attr.max_sge = 1;
  std::vector<ibv_srq*> srqs;
  for (int i = 0; i < attr.max_srq; ++i) {
    ibv_srq* srq = ibv_create_srq(dev.pd, &init);
    ASSERT_NE(srq, nullptr) << "srq " << i << ": " << std::strerror(errno);
    srqs.push_back(srq);
  }
  errno = 0;
  EXPECT_EQ(ibv_create_srq(dev.pd, &init), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  for (ibv_srq* srq : srqs) EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST(VerbErrno, AllocPdBeyondMaxPdIsEnomem) {
  Device dev;  // holds one PD already
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  std::vector<ibv_pd*> pds;
  for (int i = 1; i < attr.max_pd; ++i) {
    ibv_pd* pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr) << "pd " << i << ": " << std::strerror(errno);
    pds.push_back(pd);
  }
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(dev.ctx), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  for (ibv_pd* pd : pds) EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace loopback
