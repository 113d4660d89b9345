// Tag matching SRQs through the verbs (ibv_create_srq_ex IBV_SRQT_TM,
// ibv_post_srq_ops, IBV_WC_EX_WITH_TM_INFO): an RC QP `a` sends to `b`, whose
// receives come from a TM SRQ. A tagged EAGER lands in its tagged buffer
// without its header and reports its tag; an unexpected one lands whole in
// an ordinary WQE, and list operations then ask for a sync until the
// application reports the count; a RNDV is READ from the sender, which gets
// a FIN after its SEND's completion; DEL, max_num_tags, max_ops and the
// refusals (no CQ, a basic SRQ, a peer on another host). Over shm: tag
// matching is not offered on the udp link, nor to UC or UD QPs.
#include <infiniband/tm_types.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loopback.hpp"

namespace loopback {
namespace {

constexpr uint32_t kMaxTags = 4;
constexpr uint32_t kMaxOps = 4;
constexpr uint32_t kBytes = 256;

// One completion of an extended CQ, as its readers give it.
struct ExWc {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_GENERAL_ERR;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  uint32_t byte_len = 0;
  unsigned wc_flags = 0;
  ibv_wc_tm_info tm{};
};

bool poll_ex(ibv_cq_ex* cq, ExWc& out, Millis deadline = kDeadline) {
  const auto until = Clock::now() + deadline;
  ibv_poll_cq_attr attr{};
  int rc;
  while ((rc = ibv_start_poll(cq, &attr)) == ENOENT)
    if (Clock::now() > until) return false;
  if (rc != 0) return false;
  out.wr_id = cq->wr_id;
  out.status = cq->status;
  out.opcode = ibv_wc_read_opcode(cq);
  out.byte_len = ibv_wc_read_byte_len(cq);
  out.wc_flags = ibv_wc_read_wc_flags(cq);
  ibv_wc_read_tm_info(cq, &out.tm);
  ibv_end_poll(cq);
  return true;
}

void write_tmh(uint8_t* p, uint8_t opcode, uint64_t tag, uint32_t app_ctx) {
  std::memset(p, 0, 16);
  p[0] = opcode;
  for (int i = 0; i < 4; ++i) p[4 + i] = static_cast<uint8_t>(app_ctx >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) p[8 + i] = static_cast<uint8_t>(tag >> (56 - 8 * i));
}

void write_be(uint8_t* p, int n, uint64_t v) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}

// An extended CQ that reports tag matching details.
ibv_cq_ex* create_tm_cq(ibv_context* ctx) {
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 64;
  cq_attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
  return ibv_create_cq_ex(ctx, &cq_attr);
}

// A tag matching SRQ of kMaxTags tags and kMaxOps outstanding operations.
ibv_srq* create_tm_srq(ibv_context* ctx, ibv_pd* pd, ibv_cq_ex* cq) {
  ibv_srq_init_attr_ex srq_attr{};
  srq_attr.attr.max_wr = 16;
  srq_attr.attr.max_sge = 1;
  srq_attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  srq_attr.srq_type = IBV_SRQT_TM;
  srq_attr.pd = pd;
  srq_attr.cq = ibv_cq_ex_to_cq(cq);
  srq_attr.tm_cap.max_num_tags = kMaxTags;
  srq_attr.tm_cap.max_ops = kMaxOps;
  return ibv_create_srq_ex(ctx, &srq_attr);
}

class TagMatching : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    ibv_device_attr_ex caps{};
    ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &caps), 0);
    ASSERT_TRUE(caps.tm_caps.flags & IBV_TM_CAP_RC);
    cq = create_tm_cq(dev.ctx);
    ASSERT_NE(cq, nullptr) << std::strerror(errno);
    a_cq = create_tm_cq(dev.ctx);
    ASSERT_NE(a_cq, nullptr);
    srq = create_tm_srq(dev.ctx, dev.pd, cq);
    ASSERT_NE(srq, nullptr) << std::strerror(errno);
    a = create_qp(dev.pd, ibv_cq_ex_to_cq(a_cq), ibv_cq_ex_to_cq(a_cq), QpConfig{});
    b = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), QpConfig{}, srq);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(bring_up(a, b->qp_num, dev.gid, QpConfig{}), 0);
    ASSERT_EQ(bring_up(b, a->qp_num, dev.gid, QpConfig{}), 0);
  }
  void TearDown() override {
    if (a) ibv_destroy_qp(a);
    if (b) ibv_destroy_qp(b);
    if (srq) {
      EXPECT_EQ(ibv_destroy_srq(srq), 0);
    }
    if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
    if (a_cq) ibv_destroy_cq(ibv_cq_ex_to_cq(a_cq));
  }

  int post_op(ibv_ops_wr& op) {
    ibv_ops_wr* bad = nullptr;
    return ibv_post_srq_ops(srq, &op, &bad);
  }
  // Adds tag `tag` (exact match) over b_buf[offset, offset + length); its handle.
  uint32_t add(uint64_t tag, uint64_t wr_id, size_t offset, uint32_t length, unsigned unexpected = 0) {
    ibv_sge sge = b_buf.sge(offset, length);
    ibv_ops_wr op{};
    op.wr_id = 1000 + wr_id;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    op.tm.unexpected_cnt = unexpected;
    op.tm.add.recv_wr_id = wr_id;
    op.tm.add.sg_list = &sge;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = ~0ull;
    EXPECT_EQ(post_op(op), 0);
    return op.tm.handle;
  }
  // `length` bytes of a_buf sent by a; its completion checked.
  void send(uint32_t length) {
    ibv_sge sge = a_buf.sge(0, length);
    ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
    ASSERT_EQ(post_send(a, wr), 0);
    ExWc wc;
    ASSERT_TRUE(poll_ex(a_cq, wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  }
  void post_ordinary(uint64_t wr_id) {
    ibv_sge sge = b_buf.sge(kBytes, kBytes);
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }

  Device dev;
  ibv_cq_ex* cq = nullptr;
  ibv_cq_ex* a_cq = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
  Buffer a_buf{dev.pd, 2 * kBytes};
  Buffer b_buf{dev.pd, 2 * kBytes};
};

TEST_F(TagMatching, AMatchedEagerLandsWithoutItsHeaderAndReportsItsTag) {
  add(0x77, 5, 0, kBytes);
  ExWc wc;
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_ADD);
  EXPECT_EQ(wc.wr_id, 1005u);
  EXPECT_EQ(wc.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);
  write_tmh(a_buf.data(), IBV_TMH_EAGER, 0x77, 0xFEED);
  fill_pattern(a_buf.span(16, 100), 3);
  send(116);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.byte_len, 100u);
  EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(wc.tm.tag, 0x77u);
  EXPECT_EQ(wc.tm.priv, 0xFEEDu);
  EXPECT_EQ(first_mismatch(b_buf.span(0, 100), a_buf.span(16, 100)), -1);
}

TEST_F(TagMatching, DeletingAConsumedTagIsATmError) {
  const uint32_t handle = add(0x10, 1, 0, kBytes);
  const uint32_t other = add(0x11, 2, 0, kBytes);
  ExWc wc;
  ASSERT_TRUE(poll_ex(cq, wc));
  ASSERT_TRUE(poll_ex(cq, wc));
  write_tmh(a_buf.data(), IBV_TMH_EAGER, 0x10, 0);
  send(16);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.wr_id, 1u);
  ibv_ops_wr del{};
  del.wr_id = 50;
  del.opcode = IBV_WR_TAG_DEL;
  del.flags = IBV_OPS_SIGNALED;
  del.tm.handle = handle;
  ASSERT_EQ(post_op(del), 0);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(wc.status, IBV_WC_TM_ERR);
  del.tm.handle = other;
  ASSERT_EQ(post_op(del), 0);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  // Deleted: 0x11 is now unexpected.
  post_ordinary(9);
  write_tmh(a_buf.data(), IBV_TMH_EAGER, 0x11, 0);
  send(32);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.wc_flags, 0u);
}

TEST_F(TagMatching, AnUnexpectedMessageNeedsASyncBeforeTagsMatchAgain) {
  post_ordinary(9);
  post_ordinary(10);
  write_tmh(a_buf.data(), IBV_TMH_EAGER, 0x99, 0);
  send(64);
  ExWc wc;
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.byte_len, 64u);
  EXPECT_EQ(wc.wc_flags, 0u);
  EXPECT_EQ(wc.tm.tag, 0u);
  EXPECT_EQ(first_mismatch(b_buf.span(kBytes, 64), a_buf.span(0, 64)), -1);  // header included
  // A tag added without the count: out of sync, it matches nothing yet.
  add(0x99, 3, 0, kBytes, 0);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_ADD);
  EXPECT_NE(wc.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);
  send(64);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.wr_id, 10u);  // unexpected again
  ibv_ops_wr sync{};
  sync.wr_id = 60;
  sync.opcode = IBV_WR_TAG_SYNC;
  sync.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
  sync.tm.unexpected_cnt = 2;
  ASSERT_EQ(post_op(sync), 0);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_SYNC);
  EXPECT_EQ(wc.wr_id, 60u);
  EXPECT_EQ(wc.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);
  send(64);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
}

TEST_F(TagMatching, ARendezvousIsReadFromTheSenderWhichGetsAFin) {
  add(0x55, 4, 0, kBytes);
  ExWc wc;
  ASSERT_TRUE(poll_ex(cq, wc));
  // The data: a_buf[kBytes, 2 kBytes); the header points at it.
  fill_pattern(a_buf.span(kBytes, kBytes), 11);
  write_tmh(a_buf.data(), IBV_TMH_RNDV, 0x55, 0x1234);
  write_be(a_buf.data() + 16, 8, a_buf.addr(kBytes));
  write_be(a_buf.data() + 24, 4, a_buf.rkey());
  write_be(a_buf.data() + 28, 4, 200);
  ibv_sge fin_sge = a_buf.sge(0, 64);
  ASSERT_EQ(post_recv(a, 77, &fin_sge, 1), 0);
  send(64);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(wc.tm.tag, 0x55u);
  EXPECT_EQ(wc.tm.priv, 0x1234u);
  ASSERT_TRUE(poll_ex(cq, wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(wc.wr_id, 4u);
  EXPECT_EQ(wc.byte_len, 200u);
  EXPECT_EQ(first_mismatch(b_buf.span(0, 200), a_buf.span(kBytes, 200)), -1);
  // The FIN, after the SEND's completion (send() polled that).
  ASSERT_TRUE(poll_ex(a_cq, wc));
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.byte_len, 16u);
  EXPECT_EQ(a_buf.data()[0], IBV_TMH_FIN);
}

TEST_F(TagMatching, TheListAndEachCallAreBounded) {
  for (uint32_t i = 0; i < kMaxTags; ++i) add(i, i, 0, kBytes);
  ibv_sge sge = b_buf.sge(0, kBytes);
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_ADD;
  op.tm.add.sg_list = &sge;
  op.tm.add.num_sge = 1;
  ibv_ops_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), ENOMEM);
  EXPECT_EQ(bad, &op);
  // More than max_ops in one call: the first beyond is refused.
  ibv_ops_wr syncs[kMaxOps + 1]{};
  for (uint32_t i = 0; i <= kMaxOps; ++i) {
    syncs[i].opcode = IBV_WR_TAG_SYNC;
    syncs[i].next = i < kMaxOps ? &syncs[i + 1] : nullptr;
  }
  EXPECT_EQ(ibv_post_srq_ops(srq, syncs, &bad), ENOMEM);
  EXPECT_EQ(bad, &syncs[kMaxOps]);
  op.opcode = static_cast<ibv_ops_wr_opcode>(3);  // no opcode (and still in the enum's range)
  EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), EINVAL);
}

TEST_F(TagMatching, RefusesWhatItCannotDo) {
  // No CQ, or no tm_cap: EINVAL; more tags than the device has: EINVAL.
  ibv_srq_init_attr_ex attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TM;
  attr.srq_type = IBV_SRQT_TM;
  attr.pd = dev.pd;
  attr.tm_cap.max_num_tags = 4;
  attr.tm_cap.max_ops = 4;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  attr.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  attr.cq = ibv_cq_ex_to_cq(cq);
  ibv_device_attr_ex caps{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &caps), 0);
  attr.tm_cap.max_num_tags = caps.tm_caps.max_num_tags + 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A basic SRQ has no tag list.
  ibv_srq_init_attr basic{};
  basic.attr.max_wr = 4;
  basic.attr.max_sge = 1;
  ibv_srq* plain = ibv_create_srq(dev.pd, &basic);
  ASSERT_NE(plain, nullptr);
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_SYNC;
  ibv_ops_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_ops(plain, &op, &bad), EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_srq(plain), 0);
  // RC only (IBV_TM_CAP_RC).
  QpConfig ud;
  ud.type = IBV_QPT_UD;
  errno = 0;
  EXPECT_EQ(create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), ud, srq), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // A peer on another host (a GID not on this one) is reached by the udp
  // link, which does not carry tag matching.
  ibv_qp* c = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), QpConfig{}, srq);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(qp_to_init(c, QpConfig{}), 0);
  ibv_gid far{};
  far.raw[10] = 0xff;
  far.raw[11] = 0xff;
  far.raw[12] = 198;
  far.raw[13] = 51;
  far.raw[14] = 100;
  far.raw[15] = 1;
  EXPECT_EQ(qp_to_rtr(c, a->qp_num, far, QpConfig{}), EOPNOTSUPP);
  EXPECT_EQ(qp_state(c), IBV_QPS_INIT);
  EXPECT_EQ(ibv_destroy_qp(c), 0);
}

// Across processes: the list lives in the SRQ owner's segment and the
// sender's process matches against it. The child sends an EAGER and a RNDV
// (its own memory READ by its own process into the parent's tagged buffer)
// and checks its FIN; it reports through its exit status (0 = good, else
// the step that failed) and talks over two pipes.
bool pipe_write(int fd, const void* data, size_t n) { return ::write(fd, data, n) == static_cast<ssize_t>(n); }
bool pipe_read(int fd, void* data, size_t n) {
  if (!fd_readable(fd, Millis{15000})) return false;
  return ::read(fd, data, n) == static_cast<ssize_t>(n);
}

int sender_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = cq ? create_qp(dev.pd, cq, cq, cfg) : nullptr;
  if (!qp) return 11;
  Buffer buf(dev.pd, 2 * kBytes);
  if (!buf.mr() || qp_to_init(qp, cfg) != 0) return 12;
  ibv_sge fin = buf.sge(0, 64);
  if (post_recv(qp, 77, &fin, 1) != 0) return 13;
  uint32_t peer = 0;
  if (!pipe_write(wfd, &qp->qp_num, sizeof qp->qp_num) || !pipe_read(rfd, &peer, sizeof peer)) return 14;
  if (qp_to_rtr(qp, peer, dev.gid, cfg) != 0 || qp_to_rts(qp, cfg) != 0) return 15;
  char go = 0;
  if (!pipe_write(wfd, "R", 1) || !pipe_read(rfd, &go, 1) || go != 'G') return 16;
  write_tmh(buf.data(), IBV_TMH_EAGER, 0x21, 1);
  fill_pattern(buf.span(16, 100), 5);
  ibv_sge sge = buf.sge(0, 116);
  ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
  ibv_wc wc{};
  if (post_send(qp, wr) != 0 || !poll_one(cq, &wc, Millis{15000}) || wc.status != IBV_WC_SUCCESS) return 20;
  fill_pattern(buf.span(kBytes, 200), 6);
  write_tmh(buf.data(), IBV_TMH_RNDV, 0x22, 2);
  write_be(buf.data() + 16, 8, buf.addr(kBytes));
  write_be(buf.data() + 24, 4, buf.rkey());
  write_be(buf.data() + 28, 4, 200);
  sge = buf.sge(0, 64);
  wr = make_wr(2, IBV_WR_SEND, &sge, 1);
  if (post_send(qp, wr) != 0) return 30;
  if (!poll_one(cq, &wc, Millis{15000}) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND) return 31;
  if (!poll_one(cq, &wc, Millis{15000}) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
      wc.wr_id != 77 || wc.byte_len != 16 || buf.data()[0] != IBV_TMH_FIN)
    return 32;
  char quit = 0;
  if (!pipe_read(rfd, &quit, 1) || quit != 'Q') return 40;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return 0;
}

TEST(TagMatchingProcesses, AnotherProcessSendsEagerAndRendezvous) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    ::_exit(sender_child(to_child[0], to_parent[1]));
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  const int rfd = to_parent[0], wfd = to_child[1];
  int status = -1;
  // Whatever assertion returns early: the child is killed and reaped, the pipes closed.
  struct Reaper {
    pid_t pid;
    int& status;
    int rfd, wfd;
    ~Reaper() {
      if (status == -1) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
      ::close(rfd);
      ::close(wfd);
    }
  } reaper{pid, status, rfd, wfd};
  {
    Device dev;  // after the fork: the child opens its own
    ASSERT_TRUE(dev.ok());
    ibv_cq_ex* cq = create_tm_cq(dev.ctx);
    ASSERT_NE(cq, nullptr);
    ibv_srq* srq = create_tm_srq(dev.ctx, dev.pd, cq);
    ASSERT_NE(srq, nullptr);
    ibv_qp* b = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), QpConfig{}, srq);
    ASSERT_NE(b, nullptr);
    {
      Buffer b_buf(dev.pd, 2 * kBytes);
      ASSERT_EQ(qp_to_init(b, QpConfig{}), 0);
      uint32_t peer = 0;
      ASSERT_TRUE(pipe_write(wfd, &b->qp_num, sizeof b->qp_num));
      ASSERT_TRUE(pipe_read(rfd, &peer, sizeof peer));
      ASSERT_EQ(qp_to_rtr(b, peer, dev.gid, QpConfig{}), 0);
      ASSERT_EQ(qp_to_rts(b, QpConfig{}), 0);
      char ready = 0;
      ASSERT_TRUE(pipe_read(rfd, &ready, 1));
      for (uint64_t tag : {0x21, 0x22}) {
        ibv_sge sge = b_buf.sge(tag == 0x21 ? 0 : kBytes, kBytes);
        ibv_ops_wr op{};
        op.opcode = IBV_WR_TAG_ADD;
        op.flags = IBV_OPS_SIGNALED;
        op.tm.add.recv_wr_id = tag;
        op.tm.add.sg_list = &sge;
        op.tm.add.num_sge = 1;
        op.tm.add.tag = tag;
        op.tm.add.mask = ~0ull;
        ibv_ops_wr* bad = nullptr;
        ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
        ExWc wc;
        ASSERT_TRUE(poll_ex(cq, wc));
        EXPECT_EQ(wc.opcode, IBV_WC_TM_ADD);
      }
      ASSERT_TRUE(pipe_write(wfd, "G", 1));
      ExWc wc;
      ASSERT_TRUE(poll_ex(cq, wc, Millis{15000}));
      EXPECT_EQ(wc.wr_id, 0x21u);
      EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
      EXPECT_EQ(wc.tm.priv, 1u);
      std::vector<uint8_t> expect(100);
      fill_pattern(expect, 5);
      EXPECT_EQ(first_mismatch(b_buf.span(0, 100), expect), -1);
      ASSERT_TRUE(poll_ex(cq, wc, Millis{15000}));
      EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH});
      EXPECT_EQ(wc.tm.tag, 0x22u);
      ASSERT_TRUE(poll_ex(cq, wc, Millis{15000}));
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_DATA_VALID});
      expect.resize(200);
      fill_pattern(expect, 6);
      EXPECT_EQ(first_mismatch(b_buf.span(kBytes, 200), expect), -1);
      ASSERT_TRUE(pipe_write(wfd, "Q", 1));
      const auto until = Clock::now() + Millis{15000};
      int exited = -1;
      while (::waitpid(pid, &exited, WNOHANG) == 0 && Clock::now() < until) ::usleep(1000);
      EXPECT_TRUE(WIFEXITED(exited) && WEXITSTATUS(exited) == 0) << "child status " << exited;
      status = exited;
    }
    EXPECT_EQ(ibv_destroy_qp(b), 0);
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  }
}

}  // namespace
}  // namespace loopback
