// Data integrity of every RC operation (and the UC ones) between two QPs of one
// process: every byte of a seeded pattern arrives through multi-SGE gather and
// scatter, bytes outside the target SGEs stay untouched, and the work
// completions carry the right opcode, byte_len, imm_data, wc_flags, qp_num and
// src_qp. Then the atomics: results, memory, concurrency, and their errors.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <set>
#include <thread>
#include <utility>

#include "common/limits.hpp"
#include "loopback.hpp"

namespace loopback {
namespace {

constexpr uint8_t kGuard = 0xEE;
constexpr size_t kGap = 64;

// Where the SGEs of one side lie in its buffer: regions separated by guard gaps.
struct Layout {
  std::vector<std::pair<size_t, size_t>> regions;  // offset, length
  size_t total = 0;

  static Layout of(std::initializer_list<size_t> lengths) {
    Layout l;
    size_t offset = kGap;
    for (size_t len : lengths) {
      l.regions.emplace_back(offset, len);
      offset += len + kGap;
    }
    l.total = offset;
    return l;
  }
  std::vector<ibv_sge> sges(Buffer& buf) const {
    std::vector<ibv_sge> out;
    for (auto [off, len] : regions) out.push_back(buf.sge(off, static_cast<uint32_t>(len)));
    return out;
  }
};

// Three uneven pieces of n, in two different cuts so that SGE boundaries differ.
Layout gather_layout(size_t n) { return Layout::of({n / 4, n / 2, n - n / 4 - n / 2}); }
// `slack`: extra room in the last SGE (a receive may be larger than the message).
Layout scatter_layout(size_t n, size_t slack) { return Layout::of({n / 3, n / 6, n - n / 3 - n / 6 + slack}); }
Layout single_layout(size_t n) { return Layout::of({n}); }

// Fills the regions with the pattern, the rest with guard bytes; returns the message bytes in order.
std::vector<uint8_t> fill_source(Buffer& buf, const Layout& layout, size_t n, uint64_t seed) {
  std::memset(buf.data(), kGuard, buf.size());
  std::vector<uint8_t> message(n);
  fill_pattern(message, seed);
  size_t pos = 0;
  for (auto [off, len] : layout.regions) {
    const size_t take = std::min(len, n - pos);
    if (take) std::memcpy(buf.data() + off, message.data() + pos, take);
    pos += take;
  }
  return message;
}

// Checks that the first n bytes of the regions hold `message` and every other byte is a guard.
void expect_scattered(Buffer& buf, const Layout& layout, const std::vector<uint8_t>& message) {
  std::vector<uint8_t> expected(buf.size(), kGuard);
  size_t pos = 0;
  for (auto [off, len] : layout.regions) {
    const size_t take = std::min(len, message.size() - pos);
    if (take) std::memcpy(expected.data() + off, message.data() + pos, take);
    pos += take;
  }
  ASSERT_EQ(pos, message.size());
  const long at = first_mismatch({buf.data(), buf.size()}, expected);
  EXPECT_EQ(at, -1) << "first wrong byte at offset " << at << " of " << buf.size();
}

enum class Op { kSend, kSendImm, kWrite, kWriteImm, kRead };

const char* op_name(Op op) {
  switch (op) {
    case Op::kSend: return "Send";
    case Op::kSendImm: return "SendImm";
    case Op::kWrite: return "Write";
    case Op::kWriteImm: return "WriteImm";
    case Op::kRead: return "Read";
  }
  return "?";
}

ibv_wr_opcode wr_opcode(Op op) {
  switch (op) {
    case Op::kSend: return IBV_WR_SEND;
    case Op::kSendImm: return IBV_WR_SEND_WITH_IMM;
    case Op::kWrite: return IBV_WR_RDMA_WRITE;
    case Op::kWriteImm: return IBV_WR_RDMA_WRITE_WITH_IMM;
    case Op::kRead: return IBV_WR_RDMA_READ;
  }
  return IBV_WR_SEND;
}

ibv_wc_opcode send_wc_opcode(Op op) {
  switch (op) {
    case Op::kSend:
    case Op::kSendImm: return IBV_WC_SEND;
    case Op::kWrite:
    case Op::kWriteImm: return IBV_WC_RDMA_WRITE;
    case Op::kRead: return IBV_WC_RDMA_READ;
  }
  return IBV_WC_SEND;
}

bool has_imm(Op op) { return op == Op::kSendImm || op == Op::kWriteImm; }
bool consumes_recv(Op op) { return op == Op::kSend || op == Op::kSendImm || op == Op::kWriteImm; }

// Runs one operation of `n` bytes from pair.a to pair.b and checks bytes and completions.
void run_op(QpPair& pair, Device& dev, Op op, size_t n, uint64_t seed) {
  const bool is_send = op == Op::kSend || op == Op::kSendImm;
  // The local side gathers (or, for READ, scatters) through 3 SGEs; SEND scatters through 3 at b.
  const Layout local = op == Op::kRead ? scatter_layout(n, 0) : gather_layout(n);
  const Layout remote = is_send ? scatter_layout(n, 100) : single_layout(n);
  Buffer lbuf(dev.pd, local.total);
  Buffer rbuf(dev.pd, remote.total);
  ASSERT_NE(lbuf.mr(), nullptr);
  ASSERT_NE(rbuf.mr(), nullptr);

  std::vector<uint8_t> message;
  if (op == Op::kRead) {
    message = fill_source(rbuf, remote, n, seed);
    std::memset(lbuf.data(), kGuard, lbuf.size());
  } else {
    message = fill_source(lbuf, local, n, seed);
    std::memset(rbuf.data(), kGuard, rbuf.size());
  }
  const uint32_t imm = htonl(0xC0DE0000u + static_cast<uint32_t>(n & 0xFFFF));

  if (consumes_recv(op)) {
    std::vector<ibv_sge> rsges = is_send ? remote.sges(rbuf) : std::vector<ibv_sge>{};
    ASSERT_EQ(post_recv(pair.b, 0xB0B, rsges.data(), static_cast<int>(rsges.size())), 0);
  }
  std::vector<ibv_sge> lsges = local.sges(lbuf);
  ibv_send_wr wr = make_wr(0xA11CE, wr_opcode(op), lsges.data(), static_cast<int>(lsges.size()));
  if (has_imm(op)) wr.imm_data = imm;
  if (!is_send) {
    wr.wr.rdma.remote_addr = rbuf.addr(remote.regions[0].first);
    wr.wr.rdma.rkey = rbuf.rkey();
  }
  ASSERT_EQ(post_send(pair.a, wr), 0);

  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc)) << "no send completion";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.wr_id, 0xA11CEu);
  EXPECT_EQ(wc.opcode, send_wc_opcode(op));
  EXPECT_EQ(wc.qp_num, pair.a->qp_num);
  if (op == Op::kRead) {
    EXPECT_EQ(wc.byte_len, n);
  }

  if (consumes_recv(op)) {
    ibv_wc rwc{};
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &rwc)) << "no receive completion";
    EXPECT_EQ(rwc.status, IBV_WC_SUCCESS) << wc_str(rwc);
    EXPECT_EQ(rwc.wr_id, 0xB0Bu);
    EXPECT_EQ(rwc.opcode, op == Op::kWriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV);
    EXPECT_EQ(rwc.byte_len, n);
    EXPECT_EQ(rwc.qp_num, pair.b->qp_num);
    EXPECT_EQ(rwc.src_qp, pair.a->qp_num);
    EXPECT_EQ((rwc.wc_flags & IBV_WC_WITH_IMM) != 0, has_imm(op));
    EXPECT_EQ(rwc.wc_flags & IBV_WC_GRH, 0u);  // no GRH on connected QPs
    if (has_imm(op)) {
      EXPECT_EQ(rwc.imm_data, imm);
    }
  } else {
    EXPECT_TRUE(stays_empty(pair.b_recv_cq, Millis{5})) << "one-sided op produced a receive completion";
  }
  // No other completion anywhere.
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{1}));

  if (op == Op::kRead) {
    expect_scattered(lbuf, local, message);
    expect_scattered(rbuf, remote, message);  // the source was only read
  } else {
    expect_scattered(rbuf, remote, message);
  }
}

// ---------------------------------------------------------------------------
// 1. RC data integrity: op x size.

using DataParam = std::tuple<Op, size_t>;

class RcData : public ::testing::TestWithParam<DataParam> {};

TEST_P(RcData, EveryByteAndCompletionFields) {
  const auto [op, n] = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  run_op(pair, dev, op, n, 1000 + n);
  // A second message on the same connection, with other bytes.
  run_op(pair, dev, op, n, 2000 + n);
}

INSTANTIATE_TEST_SUITE_P(Ops, RcData,
                         ::testing::Combine(::testing::Values(Op::kSend, Op::kSendImm, Op::kWrite, Op::kWriteImm,
                                                              Op::kRead),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7}, size_t{4096},
                                                              size_t{65537}, size_t{1} << 20)),
                         [](const ::testing::TestParamInfo<DataParam>& info) {
                           return std::string(op_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// UC carries SEND and WRITE the same way (no READ, no atomics).
class UcData : public ::testing::TestWithParam<DataParam> {};

TEST_P(UcData, EveryByteAndCompletionFields) {
  const auto [op, n] = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.type = IBV_QPT_UC;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  run_op(pair, dev, op, n, 3000 + n);
}

INSTANTIATE_TEST_SUITE_P(Ops, UcData,
                         ::testing::Combine(::testing::Values(Op::kSend, Op::kSendImm, Op::kWrite, Op::kWriteImm),
                                            ::testing::Values(size_t{0}, size_t{7}, size_t{65537})),
                         [](const ::testing::TestParamInfo<DataParam>& info) {
                           return std::string(op_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Many messages in flight at once arrive in order, each intact.
TEST(RcDataStream, HundredSendsInOrder) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_send_wr = 128;
  cfg.max_recv_wr = 128;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  constexpr int kCount = 100;
  constexpr uint32_t kSize = 1000;
  Buffer src(dev.pd, kCount * kSize);
  Buffer dst(dev.pd, kCount * kSize);
  fill_pattern({src.data(), src.size()}, 77);
  for (int i = 0; i < kCount; ++i) {
    ibv_sge sge = dst.sge(i * kSize, kSize);
    ASSERT_EQ(post_recv(pair.b, i, &sge, 1), 0);
  }
  std::vector<ibv_send_wr> wrs(kCount);
  std::vector<ibv_sge> sges(kCount);
  for (int i = 0; i < kCount; ++i) {
    sges[i] = src.sge(i * kSize, kSize);
    wrs[i] = make_wr(i, IBV_WR_SEND, &sges[i], 1);
    wrs[i].next = i + 1 < kCount ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(pair.a, &wrs[0], &bad), 0);
  auto sent = poll_n(pair.a_send_cq, kCount);
  auto got = poll_n(pair.b_recv_cq, kCount);
  ASSERT_EQ(sent.size(), size_t{kCount});
  ASSERT_EQ(got.size(), size_t{kCount});
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(sent[i].wr_id, uint64_t(i));
    EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(got[i].wr_id, uint64_t(i));
    EXPECT_EQ(got[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(got[i].byte_len, kSize);
  }
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
}

// UCX's rc_verbs moves its QPs to RTR with grh.flow_label 0xFFFFFFFF. The
// kernel takes any value and mlx5 keeps the field's 20 bits: the modify
// succeeds, ibv_query_qp reports 0xFFFFF, and the connection carries data.
TEST(FlowLabel, AllOnesIsTakenAndKeptAsTwentyBits) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* b = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
    ASSERT_EQ(qp_to_init(qp, cfg), 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = IBV_MTU_1024;
    attr.dest_qp_num = peer->qp_num;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 1;
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = dev.gid;
    attr.ah_attr.grh.flow_label = 0xFFFFFFFF;
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.port_num = 1;
    errno = 0;
    ASSERT_EQ(ibv_modify_qp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0)
        << std::strerror(errno);
    ASSERT_EQ(qp_to_rts(qp, cfg), 0);
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibv_query_qp(qp, &got, IBV_QP_AV, &init), 0);
    EXPECT_EQ(got.ah_attr.grh.flow_label, 0xFFFFFu);
  }
  Buffer buf(dev.pd, 128);
  std::memcpy(buf.data(), "flow", 4);
  ibv_sge rsge = buf.sge(64, 64);
  ASSERT_EQ(post_recv(b, 1, &rsge, 1), 0);
  ibv_sge sge = buf.sge(0, 4);
  ibv_send_wr wr = make_wr(2, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(a, wr), 0);
  auto done = poll_n(cq, 2);
  ASSERT_EQ(done.size(), 2u);
  for (const ibv_wc& wc : done) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(std::memcmp(buf.data() + 64, "flow", 4), 0);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_destroy_cq(cq);
}

// Two contexts (two ibv_open_device calls) in one process talk like two hosts' QPs.
TEST(TwoContexts, SendWriteReadBetweenContexts) {
  Device d1, d2;
  ASSERT_TRUE(d1.ok());
  ASSERT_TRUE(d2.ok());
  ASSERT_NE(d1.ctx, d2.ctx);
  QpConfig cfg;
  ibv_cq* cq1 = ibv_create_cq(d1.ctx, 16, nullptr, nullptr, 0);
  ibv_cq* cq2 = ibv_create_cq(d2.ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(cq1 && cq2);
  ibv_qp* q1 = create_qp(d1.pd, cq1, cq1, cfg);
  ibv_qp* q2 = create_qp(d2.pd, cq2, cq2, cfg);
  ASSERT_TRUE(q1 && q2);
  ASSERT_EQ(bring_up(q1, q2->qp_num, d1.gid, cfg), 0);
  ASSERT_EQ(bring_up(q2, q1->qp_num, d2.gid, cfg), 0);
  {
    Buffer b1(d1.pd, 8192);
    Buffer b2(d2.pd, 8192);
    fill_pattern(b1.span(0, 4096), 11);
    fill_pattern(b2.span(4096, 4096), 12);
    ibv_sge rsge = b2.sge(0, 1024);
    ASSERT_EQ(post_recv(q2, 1, &rsge, 1), 0);
    ibv_sge s1 = b1.sge(0, 1024);
    ibv_send_wr send = make_wr(2, IBV_WR_SEND, &s1, 1);
    ibv_sge s2 = b1.sge(1024, 3072);
    ibv_send_wr write = make_wr(3, IBV_WR_RDMA_WRITE, &s2, 1);
    write.wr.rdma.remote_addr = b2.addr(1024);
    write.wr.rdma.rkey = b2.rkey();
    ibv_sge s3 = b1.sge(4096, 4096);
    ibv_send_wr read = make_wr(4, IBV_WR_RDMA_READ, &s3, 1);
    read.wr.rdma.remote_addr = b2.addr(4096);
    read.wr.rdma.rkey = b2.rkey();
    send.next = &write;
    write.next = &read;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(q1, &send, &bad), 0);
    auto wcs = poll_n(cq1, 3);
    ASSERT_EQ(wcs.size(), 3u);
    for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(cq2, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, 1024u);
    EXPECT_EQ(wc.src_qp, q1->qp_num);
    EXPECT_EQ(std::memcmp(b1.data(), b2.data(), 8192), 0);
    // A key of one context's PD means nothing to a QP of the other's.
    ibv_sge s4 = b1.sge(0, 8);
    ibv_send_wr wrong = make_wr(5, IBV_WR_RDMA_WRITE, &s4, 1);
    wrong.wr.rdma.remote_addr = b1.addr(64);
    wrong.wr.rdma.rkey = b1.rkey();
    ASSERT_EQ(post_send(q1, wrong), 0);
    ASSERT_TRUE(poll_one(cq1, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
    // The responder's context gets the event, not the requester's.
    decltype(ibv_async_event::element) element{};
    ASSERT_TRUE(wait_async_event(d2.ctx, IBV_EVENT_QP_ACCESS_ERR, &element));
    EXPECT_EQ(element.qp, q2);
    EXPECT_FALSE(fd_readable(d1.ctx->async_fd, Millis{10}));
  }
  EXPECT_EQ(ibv_destroy_qp(q1), 0);
  EXPECT_EQ(ibv_destroy_qp(q2), 0);
  EXPECT_EQ(ibv_destroy_cq(cq1), 0);
  EXPECT_EQ(ibv_destroy_cq(cq2), 0);
}

// Unsignaled WRs complete silently on success, but an error is always reported;
// sq_sig_all makes every WR signaled.
TEST(RcSignaling, UnsignaledSuccessIsSilentErrorIsNot) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pair(dev, QpConfig{});
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 64, Buffer::kAllAccess, 0x11);
  Buffer dst(dev.pd, 64, Buffer::kAllAccess, 0x00);
  ibv_sge sge = src.sge(0, 32);
  ibv_send_wr w1 = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1, 0);
  w1.wr.rdma.remote_addr = dst.addr();
  w1.wr.rdma.rkey = dst.rkey();
  ibv_send_wr w2 = w1;
  w2.wr_id = 2;
  w2.send_flags = IBV_SEND_SIGNALED;
  w2.wr.rdma.remote_addr = dst.addr(32);
  w1.next = &w2;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(pair.a, &w1, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(stays_empty(pair.a_send_cq, Millis{2}));
  EXPECT_EQ(first_not(dst.span(0, 64), 0x11), -1);
  // An unsignaled WR that fails still completes (in error).
  ibv_send_wr w3 = make_wr(3, IBV_WR_RDMA_WRITE, &sge, 1, 0);
  w3.wr.rdma.remote_addr = dst.addr();
  w3.wr.rdma.rkey = dst.rkey() ^ 0x10100;
  ASSERT_EQ(post_send(pair.a, w3), 0);
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
}

TEST(RcSignaling, SqSigAllSignalsEveryWr) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.sq_sig_all = true;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 8);
  for (uint64_t i = 0; i < 3; ++i) {
    ibv_send_wr wr = make_wr(i, IBV_WR_RDMA_WRITE, &sge, 1, 0);
    wr.wr.rdma.remote_addr = buf.addr(32);
    wr.wr.rdma.rkey = buf.rkey();
    ASSERT_EQ(post_send(pair.a, wr), 0);
  }
  auto wcs = poll_n(pair.a_send_cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i);
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS);
  }
}

// ---------------------------------------------------------------------------
// Inline data: up to max_inline_data, from unregistered memory, copied at post.

using InlineParam = std::tuple<Op, uint32_t>;

class RcInline : public ::testing::TestWithParam<InlineParam> {};

TEST_P(RcInline, CopiedAtPostTime) {
  const auto [op, n] = GetParam();
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_inline_data = softhca::limits::kMaxInlineData;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(pair.a, &attr, IBV_QP_CAP, &init), 0);
  ASSERT_GE(init.cap.max_inline_data, softhca::limits::kMaxInlineData);

  // Unregistered source, split over two SGEs with a junk lkey (ignored for inline).
  std::vector<uint8_t> source(n);
  fill_pattern(source, 500 + n);
  const std::vector<uint8_t> message = source;
  ibv_sge sges[2] = {{reinterpret_cast<uint64_t>(source.data()), n / 3, 0xDEAD},
                     {reinterpret_cast<uint64_t>(source.data() + n / 3), n - n / 3, 0xBEEF}};
  Buffer rbuf(dev.pd, n + 2 * kGap);
  std::memset(rbuf.data(), kGuard, rbuf.size());
  const bool is_send = op != Op::kWrite && op != Op::kWriteImm;
  if (consumes_recv(op)) {
    ibv_sge rsge = rbuf.sge(kGap, n + kGap);
    ASSERT_EQ(post_recv(pair.b, 7, &rsge, is_send ? 1 : 0), 0);
  }
  ibv_send_wr wr = make_wr(9, wr_opcode(op), sges, 2, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  wr.imm_data = htonl(n);
  if (!is_send) {
    wr.wr.rdma.remote_addr = rbuf.addr(kGap);
    wr.wr.rdma.rkey = rbuf.rkey();
  }
  ASSERT_EQ(post_send(pair.a, wr), 0);
  std::fill(source.begin(), source.end(), uint8_t{0});  // reusable at once

  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, send_wc_opcode(op));
  if (consumes_recv(op)) {
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.byte_len, n);
    EXPECT_EQ((wc.wc_flags & IBV_WC_WITH_IMM) != 0, has_imm(op));
    if (has_imm(op)) {
      EXPECT_EQ(wc.imm_data, htonl(n));
    }
  }
  EXPECT_EQ(first_mismatch(rbuf.span(kGap, n), message), -1);
  EXPECT_EQ(first_not(rbuf.span(0, kGap), kGuard), -1);
  EXPECT_EQ(first_not(rbuf.span(kGap + n, kGap), kGuard), -1);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RcInline,
                         ::testing::Combine(::testing::Values(Op::kSend, Op::kSendImm, Op::kWrite, Op::kWriteImm),
                                            ::testing::Values(0u, 1u, 7u, 64u, softhca::limits::kMaxInlineData)),
                         [](const ::testing::TestParamInfo<InlineParam>& info) {
                           return std::string(op_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(RcInlineLimit, LargerThanMaxInlineIsEinval) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.max_inline_data = 64;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(pair.a, &attr, IBV_QP_CAP, &init), 0);
  std::vector<uint8_t> source(init.cap.max_inline_data + 1);
  ibv_sge sge{reinterpret_cast<uint64_t>(source.data()), static_cast<uint32_t>(source.size()), 0};
  ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(pair.a, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
}

// ---------------------------------------------------------------------------
// 2. Atomics.

struct AtomicSetup {
  Device dev;
  QpPair pair{dev, QpConfig{}};
  Buffer target{dev.pd, 64};
  Buffer result{dev.pd, 64};

  uint64_t& word(size_t index = 0) { return *reinterpret_cast<uint64_t*>(target.data() + 8 * index); }
  uint64_t& original() { return *reinterpret_cast<uint64_t*>(result.data()); }

  // Posts one atomic from pair.a and returns its completion.
  ibv_wc run(ibv_wr_opcode opcode, uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
    ibv_sge sge = result.sge(0, 8);
    ibv_send_wr wr = make_wr(42, opcode, &sge, 1);
    wr.wr.atomic.remote_addr = remote_addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    ibv_wc wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    if (post_send(pair.a, wr) != 0) return wc;
    if (!poll_one(pair.a_send_cq, &wc)) wc.status = IBV_WC_GENERAL_ERR;
    return wc;
  }
};

TEST(RcAtomic, CompareAndSwap) {
  AtomicSetup s;
  ASSERT_TRUE(s.pair.ok());
  s.word() = 0x1111222233334444ULL;
  s.original() = 0;
  // Compare matches: swapped, the old value comes back.
  ibv_wc wc = s.run(IBV_WR_ATOMIC_CMP_AND_SWP, s.target.addr(), s.target.rkey(), 0x1111222233334444ULL,
                    0xAAAABBBBCCCCDDDDULL);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(wc.qp_num, s.pair.a->qp_num);
  EXPECT_EQ(s.original(), 0x1111222233334444ULL);
  EXPECT_EQ(s.word(), 0xAAAABBBBCCCCDDDDULL);
  // Compare differs: memory unchanged, the current value comes back.
  wc = s.run(IBV_WR_ATOMIC_CMP_AND_SWP, s.target.addr(), s.target.rkey(), 5, 6);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(s.original(), 0xAAAABBBBCCCCDDDDULL);
  EXPECT_EQ(s.word(), 0xAAAABBBBCCCCDDDDULL);
  // Neighbouring words untouched.
  EXPECT_EQ(s.word(1), 0u);
  EXPECT_TRUE(stays_empty(s.pair.b_recv_cq, Millis{2}));
}

TEST(RcAtomic, FetchAndAdd) {
  AtomicSetup s;
  ASSERT_TRUE(s.pair.ok());
  s.word(2) = 0xFFFFFFFFFFFFFFF0ULL;
  ibv_wc wc = s.run(IBV_WR_ATOMIC_FETCH_AND_ADD, s.target.addr(16), s.target.rkey(), 0x20, 0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(s.original(), 0xFFFFFFFFFFFFFFF0ULL);
  EXPECT_EQ(s.word(2), 0x10u);  // wraps modulo 2^64
  wc = s.run(IBV_WR_ATOMIC_FETCH_AND_ADD, s.target.addr(16), s.target.rkey(), 5, 0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(s.original(), 0x10u);
  EXPECT_EQ(s.word(2), 0x15u);
  EXPECT_EQ(s.word(1), 0u);
  EXPECT_EQ(s.word(3), 0u);
}

// Two QPs (each with its own thread) add to one word concurrently: no add is
// lost and every FAA saw a distinct old value.
TEST(RcAtomic, ConcurrentFetchAndAddFromTwoQps) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair p1(dev, QpConfig{});
  QpPair p2(dev, QpConfig{});
  ASSERT_TRUE(p1.ok());
  ASSERT_TRUE(p2.ok());
  Buffer target(dev.pd, 8);
  *reinterpret_cast<uint64_t*>(target.data()) = 0;
  constexpr int kPerQp = 2000;
  constexpr int kWindow = 16;
  std::vector<uint64_t> seen[2];
  std::atomic<bool> failed{false};
  auto worker = [&](QpPair& p, int index) {
    Buffer results(dev.pd, 8 * kWindow);
    std::vector<uint64_t>& out = seen[index];
    int posted = 0, done = 0;
    const auto until = Clock::now() + Millis{20000};
    while (done < kPerQp && !failed.load()) {
      while (posted < kPerQp && posted - done < kWindow) {
        const int slot = posted % kWindow;
        ibv_sge sge = results.sge(8 * slot, 8);
        ibv_send_wr wr = make_wr(posted, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, 1);
        wr.wr.atomic.remote_addr = target.addr();
        wr.wr.atomic.rkey = target.rkey();
        wr.wr.atomic.compare_add = 1;
        if (post_send(p.a, wr) != 0) {
          failed = true;
          return;
        }
        ++posted;
      }
      ibv_wc wc[kWindow];
      const int got = ibv_poll_cq(p.a_send_cq, kWindow, wc);
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != uint64_t(done)) {
          failed = true;
          return;
        }
        out.push_back(*reinterpret_cast<uint64_t*>(results.data() + 8 * (done % kWindow)));
        ++done;
      }
      if (got == 0 && Clock::now() > until) {
        failed = true;
        return;
      }
    }
  };
  std::thread t1(worker, std::ref(p1), 0);
  std::thread t2(worker, std::ref(p2), 1);
  t1.join();
  t2.join();
  ASSERT_FALSE(failed.load());
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(target.data()), uint64_t{2 * kPerQp});
  std::set<uint64_t> all(seen[0].begin(), seen[0].end());
  all.insert(seen[1].begin(), seen[1].end());
  EXPECT_EQ(all.size(), size_t{2 * kPerQp}) << "two FAAs returned the same old value";
  if (!all.empty()) {
    EXPECT_EQ(*all.begin(), 0u);
    EXPECT_EQ(*all.rbegin(), uint64_t{2 * kPerQp - 1});
  }
}

// Two QPs stream WRITEs and SENDs of many packets at once, posted turn
// about. Over the udp link both leave through one socket to one address, so
// the receiver's kernel coalesces their packets into shared runs: each
// packet must still reach its own QP's memory and receive queue, whole and
// in order.
TEST(RcWrite, TwoQpsInterleavedStreamsLandWhole) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpPair pairs[2] = {QpPair(dev, QpConfig{}), QpPair(dev, QpConfig{})};
  ASSERT_TRUE(pairs[0].ok());
  ASSERT_TRUE(pairs[1].ok());
  constexpr size_t kChunk = 32768;  // 32 packets at a 1024-byte MTU
  constexpr int kRounds = 24;
  constexpr size_t kSend = 8192;
  constexpr int kSends = 8;
  std::vector<std::unique_ptr<Buffer>> src, dst, send_src, recv_dst;
  for (int q = 0; q < 2; ++q) {
    src.push_back(std::make_unique<Buffer>(dev.pd, kChunk * kRounds));
    dst.push_back(std::make_unique<Buffer>(dev.pd, kChunk * kRounds));
    send_src.push_back(std::make_unique<Buffer>(dev.pd, kSend * kSends));
    recv_dst.push_back(std::make_unique<Buffer>(dev.pd, kSend * kSends));
    fill_pattern({src[q]->data(), src[q]->size()}, 40 + q);
    fill_pattern({send_src[q]->data(), send_src[q]->size()}, 50 + q);
    for (int i = 0; i < kSends; ++i) {
      ibv_sge sge = recv_dst[q]->sge(kSend * i, kSend);
      ASSERT_EQ(post_recv(pairs[q].b, i, &sge, 1), 0);
    }
  }
  // Turn about: a WRITE on each QP, and every third round a SEND on each.
  int sends_posted = 0;
  size_t completions[2] = {0, 0};
  for (int r = 0; r < kRounds; ++r) {
    for (int q = 0; q < 2; ++q) {
      ibv_sge sge = src[q]->sge(kChunk * r, kChunk);
      ibv_send_wr wr = make_wr(r, IBV_WR_RDMA_WRITE, &sge, 1);
      wr.wr.rdma.remote_addr = dst[q]->addr(kChunk * r);
      wr.wr.rdma.rkey = dst[q]->rkey();
      ASSERT_EQ(post_send(pairs[q].a, wr), 0);
    }
    if (r % 3 == 0 && sends_posted < kSends) {
      for (int q = 0; q < 2; ++q) {
        ibv_sge sge = send_src[q]->sge(kSend * sends_posted, kSend);
        ibv_send_wr wr = make_wr(1000 + sends_posted, IBV_WR_SEND, &sge, 1);
        ASSERT_EQ(post_send(pairs[q].a, wr), 0);
      }
      ++sends_posted;
    }
    // Keep each send queue within its depth.
    for (int q = 0; q < 2; ++q) {
      ibv_wc wc[16];
      const int got = ibv_poll_cq(pairs[q].a_send_cq, 16, wc);
      ASSERT_GE(got, 0);
      for (int i = 0; i < got; ++i) ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << wc_str(wc[i]);
      completions[q] += static_cast<size_t>(got);
    }
  }
  for (int q = 0; q < 2; ++q) {
    const size_t expected = kRounds + static_cast<size_t>(sends_posted);
    auto rest = poll_n(pairs[q].a_send_cq, expected - completions[q]);
    ASSERT_EQ(rest.size(), expected - completions[q]) << "qp " << q;
    for (const ibv_wc& wc : rest) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    auto received = poll_n(pairs[q].b_recv_cq, static_cast<size_t>(sends_posted));
    ASSERT_EQ(received.size(), static_cast<size_t>(sends_posted)) << "qp " << q;
    for (size_t i = 0; i < received.size(); ++i) {
      EXPECT_EQ(received[i].status, IBV_WC_SUCCESS) << wc_str(received[i]);
      EXPECT_EQ(received[i].wr_id, i);
      EXPECT_EQ(received[i].byte_len, kSend);
    }
    EXPECT_EQ(first_mismatch({src[q]->data(), src[q]->size()}, {dst[q]->data(), dst[q]->size()}), -1) << "qp " << q;
    const size_t sent_bytes = kSend * static_cast<size_t>(sends_posted);
    EXPECT_EQ(first_mismatch({send_src[q]->data(), sent_bytes}, {recv_dst[q]->data(), sent_bytes}), -1) << "qp " << q;
  }
}

TEST(RcAtomic, MisalignedIsRemoteInvalidRequest) {
  AtomicSetup s;
  ASSERT_TRUE(s.pair.ok());
  s.word() = 7;
  s.word(1) = 7;
  const ibv_wc wc = s.run(IBV_WR_ATOMIC_FETCH_AND_ADD, s.target.addr(4), s.target.rkey(), 1, 0);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << wc_str(wc);
  EXPECT_EQ(s.word(), 7u);
  EXPECT_EQ(s.word(1), 7u);
  EXPECT_EQ(qp_state(s.pair.a), IBV_QPS_ERR);
}

TEST(RcAtomic, MrWithoutRemoteAtomicIsRemoteAccessError) {
  AtomicSetup s;
  ASSERT_TRUE(s.pair.ok());
  Buffer no_atomic(s.dev.pd, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(no_atomic.mr(), nullptr);
  *reinterpret_cast<uint64_t*>(no_atomic.data()) = 3;
  const ibv_wc wc = s.run(IBV_WR_ATOMIC_CMP_AND_SWP, no_atomic.addr(), no_atomic.rkey(), 3, 4);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(no_atomic.data()), 3u);
  // The responder reports the access violation.
  decltype(ibv_async_event::element) element{};
  EXPECT_TRUE(wait_async_event(s.dev.ctx, IBV_EVENT_QP_ACCESS_ERR, &element));
  EXPECT_EQ(element.qp, s.pair.b);
}

TEST(RcAtomic, QpWithoutRemoteAtomicAccessIsRemoteAccessError) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg_b;
  cfg_b.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  QpPair pair(dev, QpConfig{}, cfg_b);
  ASSERT_TRUE(pair.ok());
  Buffer target(dev.pd, 8);
  Buffer result(dev.pd, 8);
  ibv_sge sge = result.sge(0, 8);
  ibv_send_wr wr = make_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, 1);
  wr.wr.atomic.remote_addr = target.addr();
  wr.wr.atomic.rkey = target.rkey();
  wr.wr.atomic.compare_add = 1;
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(target.data()), 0u);
}

// An MR keeps its pages, as a NIC's pins them: an application that unmaps
// memory it still has registered has only lost its own view of it.
class RegisteredPages : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(pair.ok());
  }
  // One signaled WR on `a`; its completion.
  ibv_wc run(ibv_send_wr wr) {
    ibv_wc wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    if (post_send(pair.a, wr) == 0 && !poll_one(pair.a_send_cq, &wc)) wc.status = IBV_WC_GENERAL_ERR;
    return wc;
  }
  // Two whole pages holding `seed`'s pattern, registered, then unmapped by
  // the application; their address and MR.
  ibv_mr* register_then_unmap(uint64_t seed, uint64_t& addr) {
    void* pages = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) return nullptr;
    fill_pattern(std::span<uint8_t>(static_cast<uint8_t*>(pages), length), seed);
    ibv_mr* mr = ibv_reg_mr(dev.pd, pages, length, Buffer::kAllAccess);
    munmap(pages, length);
    addr = reinterpret_cast<uint64_t>(pages);
    return mr;
  }
  ibv_send_wr rdma(uint64_t id, ibv_wr_opcode op, ibv_sge* sge, uint64_t remote, uint32_t rkey) {
    ibv_send_wr wr = make_wr(id, op, sge, 1);
    wr.wr.rdma = {remote, rkey};
    return wr;
  }

  Device dev;
  QpPair pair{dev, QpConfig{}, 16};
  const size_t length = 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
};

// WRITEs, READs and atomics into an MR whose pages the application unmapped
// land in and come from those pages, and nothing faults: before, a WRITE
// from a QP of the same process, or one placed by the udp link's thread,
// stored through the unmapped address and killed the process.
TEST_F(RegisteredPages, AsATargetOutliveTheApplicationsMappingOfThem) {
  uint64_t remote = 0;
  ibv_mr* mr = register_then_unmap(1, remote);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  Buffer pattern(dev.pd, length), back(dev.pd, length), word(dev.pd, 8);
  fill_pattern(pattern.span(0, length), 77);
  ibv_sge from = pattern.sge(0, static_cast<uint32_t>(length));
  ibv_wc wc = run(rdma(1, IBV_WR_RDMA_WRITE, &from, remote, mr->rkey));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ibv_sge into = back.sge(0, static_cast<uint32_t>(length));
  wc = run(rdma(2, IBV_WR_RDMA_READ, &into, remote, mr->rkey));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(back.span(0, length), pattern.span(0, length)), -1);
  ibv_sge original = word.sge(0, 8);
  ibv_send_wr add = make_wr(3, IBV_WR_ATOMIC_FETCH_AND_ADD, &original, 1);
  add.wr.atomic.remote_addr = remote;
  add.wr.atomic.rkey = mr->rkey;
  add.wr.atomic.compare_add = 5;
  wc = run(add);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(std::memcmp(word.data(), pattern.data(), 8), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// The same of local buffers: a WRITE sends what the MR's pages hold, a READ
// lands in them.
TEST_F(RegisteredPages, AsLocalBuffersOutliveTheApplicationsMappingOfThem) {
  uint64_t local = 0;
  ibv_mr* mr = register_then_unmap(2, local);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  std::vector<uint8_t> expect(length);
  fill_pattern(expect, 2);
  Buffer target(dev.pd, length), source(dev.pd, length), again(dev.pd, length);
  ibv_sge from{local, static_cast<uint32_t>(length), mr->lkey};
  ibv_wc wc = run(rdma(1, IBV_WR_RDMA_WRITE, &from, target.addr(), target.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(target.span(0, length), expect), -1);
  fill_pattern(source.span(0, length), 3);
  wc = run(rdma(2, IBV_WR_RDMA_READ, &from, source.addr(), source.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  wc = run(rdma(3, IBV_WR_RDMA_WRITE, &from, again.addr(), again.rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(again.span(0, length), source.span(0, length)), -1);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

}  // namespace
}  // namespace loopback
