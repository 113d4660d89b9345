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

#include <thread>

#include "child_process.hpp"
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
ibv_cq_ex* create_tm_cq(ibv_context* ctx, uint32_t cqe = 64) {
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = cqe;
  cq_attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
  return ibv_create_cq_ex(ctx, &cq_attr);
}

// A tag matching SRQ of `max_tags` tags (kMaxTags unless told) and kMaxOps
// outstanding operations.
ibv_srq* create_tm_srq(ibv_context* ctx, ibv_pd* pd, ibv_cq_ex* cq, uint32_t max_tags = kMaxTags,
                       uint32_t max_wr = 16) {
  ibv_srq_init_attr_ex srq_attr{};
  srq_attr.attr.max_wr = max_wr;
  srq_attr.attr.max_sge = 1;
  srq_attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  srq_attr.srq_type = IBV_SRQT_TM;
  srq_attr.pd = pd;
  srq_attr.cq = ibv_cq_ex_to_cq(cq);
  srq_attr.tm_cap.max_num_tags = max_tags;
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

// The list driven past both of its bounds round after round, between
// matches, consumed-tag DELs and the sync protocol: every refusal is the
// same errno with *bad naming the op, and every list completion has the
// status and the SYNC_REQ flag the state of the list calls for.
TEST_F(TagMatching, TheListIsDrivenPastItsBoundsAgainAndAgain) {
  uint32_t unexpected = 0;
  ExWc wc;
  auto expect_list_op = [&](ibv_wc_opcode opcode, ibv_wc_status status, bool sync_req) {
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.opcode, opcode);
    EXPECT_EQ(wc.status, status);
    EXPECT_EQ((wc.wc_flags & IBV_WC_TM_SYNC_REQ) != 0, sync_req);
  };
  auto del = [&](uint32_t handle) {
    ibv_ops_wr op{};
    op.opcode = IBV_WR_TAG_DEL;
    op.flags = IBV_OPS_SIGNALED;
    op.tm.handle = handle;
    EXPECT_EQ(post_op(op), 0);
  };
  auto sync = [&](uint32_t count) {
    ibv_ops_wr op{};
    op.opcode = IBV_WR_TAG_SYNC;
    op.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    op.tm.unexpected_cnt = count;
    EXPECT_EQ(post_op(op), 0);
  };
  ibv_sge sge = b_buf.sge(0, 64);
  auto add_refused = [&](uint64_t tag) {
    ibv_ops_wr op{};
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED;
    op.tm.add.sg_list = &sge;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = ~0ull;
    ibv_ops_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), ENOMEM);
    EXPECT_EQ(bad, &op);
  };
  auto send_eager = [&](uint64_t tag, uint32_t payload) {
    write_tmh(a_buf.data(), IBV_TMH_EAGER, tag, 0);
    send(16 + payload);
  };
  for (int round = 0; round < 50 && !HasFailure(); ++round) {
    SCOPED_TRACE(round);
    const uint64_t base = 0x1000 + static_cast<uint64_t>(round) * 16;
    uint32_t handle[kMaxTags];
    for (uint32_t i = 0; i < kMaxTags; ++i) handle[i] = add(base + i, i, i * 64, 64, unexpected);
    for (uint32_t i = 0; i < kMaxTags; ++i) expect_list_op(IBV_WC_TM_ADD, IBV_WC_SUCCESS, false);
    add_refused(base + 8);  // past max_num_tags: refused, nothing completes
    // Past max_ops in one call: the first max_ops run, the one beyond is refused.
    ibv_ops_wr syncs[kMaxOps + 1]{};
    for (uint32_t i = 0; i <= kMaxOps; ++i) {
      syncs[i].opcode = IBV_WR_TAG_SYNC;
      syncs[i].flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
      syncs[i].tm.unexpected_cnt = unexpected;
      syncs[i].next = i < kMaxOps ? &syncs[i + 1] : nullptr;
    }
    ibv_ops_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_srq_ops(srq, syncs, &bad), ENOMEM);
    EXPECT_EQ(bad, &syncs[kMaxOps]);
    for (uint32_t i = 0; i < kMaxOps; ++i) expect_list_op(IBV_WC_TM_SYNC, IBV_WC_SUCCESS, false);
    // A match frees its tag; deleting that handle then fails, as a completion.
    const uint32_t taken = static_cast<uint32_t>(round) % kMaxTags;
    send_eager(base + taken, 8);
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.wr_id, taken);
    EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
    del(handle[taken]);
    expect_list_op(IBV_WC_TM_DEL, IBV_WC_TM_ERR, false);
    // Room for exactly one again.
    handle[taken] = add(base + 4, taken, taken * 64, 64, unexpected);
    expect_list_op(IBV_WC_TM_ADD, IBV_WC_SUCCESS, false);
    add_refused(base + 9);
    // An unexpected message: list operations ask for a sync, and a listed
    // tag goes unexpected too until the count is reported.
    post_ordinary(100);
    send_eager(0xdead, 16);
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.wr_id, 100u);
    EXPECT_EQ(wc.wc_flags, 0u);
    ++unexpected;
    del(handle[(taken + 1) % kMaxTags]);
    expect_list_op(IBV_WC_TM_DEL, IBV_WC_SUCCESS, true);
    const uint32_t live = (taken + 2) % kMaxTags;
    post_ordinary(101);
    send_eager(base + live, 16);
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.wr_id, 101u);
    EXPECT_EQ(wc.wc_flags, 0u);
    ++unexpected;
    sync(unexpected - 1);  // a stale count keeps the list out of step
    expect_list_op(IBV_WC_TM_SYNC, IBV_WC_SUCCESS, true);
    sync(unexpected);
    expect_list_op(IBV_WC_TM_SYNC, IBV_WC_SUCCESS, false);
    send_eager(base + live, 8);
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.wr_id, live);
    EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
    // The two entries left go, so the next round starts from an empty list.
    del(handle[taken]);
    expect_list_op(IBV_WC_TM_DEL, IBV_WC_SUCCESS, false);
    del(handle[(taken + 3) % kMaxTags]);
    expect_list_op(IBV_WC_TM_DEL, IBV_WC_SUCCESS, false);
  }
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

// ---------------------------------------------------------------------------
// Hostile but legal, across processes: a QP on a TM SRQ destroyed while a
// peer streams EAGERs at it, a rendezvous sender killed before its data was
// read, a sender killed while it matches against the list.

constexpr uint64_t kListedTag = 0x5;
constexpr uint64_t kUnlistedTag = 0x6;
constexpr uint32_t kStreamMessage = 64;  // a TMH and 48 bytes
constexpr uint32_t kOrdinaryWqes = 512;
constexpr uint8_t kAfterDestroy = 0xEE;

// Connects `qp` (in INIT) to the peer at the other end of the pipes: QPNs
// both ways, then RTR and RTS, then a byte both ways, so that neither side
// sends before the other can receive (a message to a QP still in INIT is
// dropped, and a sender with few retries would give up).
bool connect_over_pipes(ibv_qp* qp, ibv_gid gid, const QpConfig& cfg, int rfd, int wfd) {
  uint32_t peer = 0;
  char up = 0;
  return write_all(wfd, &qp->qp_num, sizeof qp->qp_num) && read_all(rfd, &peer, sizeof peer, kDeadline) &&
         qp_to_rtr(qp, peer, gid, cfg) == 0 && qp_to_rts(qp, cfg) == 0 && write_all(wfd, "C", 1) &&
         read_all(rfd, &up, 1, kDeadline) && up == 'C';
}

// Sends EAGERs of `tag` without pause; says 'G' after ten went through,
// then, once one fails, sends its status and waits for 'Q'. Its QP gives
// up soon after the receiver is gone and waits out RNR without end.
int eager_stream_child(int rfd, int wfd, uint64_t tag) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  cfg.timeout = 8;  // 1 ms
  cfg.retry_cnt = 1;
  cfg.rnr_retry = 7;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = cq ? create_qp(dev.pd, cq, cq, cfg) : nullptr;
  if (!qp) return 11;
  Buffer buf(dev.pd, kStreamMessage);
  if (!buf.mr() || qp_to_init(qp, cfg) != 0 || !connect_over_pipes(qp, dev.gid, cfg, rfd, wfd)) return 12;
  write_tmh(buf.data(), IBV_TMH_EAGER, tag, 0);
  fill_pattern(buf.span(16, kStreamMessage - 16), 9);
  ibv_sge sge = buf.sge(0, kStreamMessage);
  ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
  ibv_wc wc{};
  for (uint32_t sent = 0;; ++sent) {
    if (post_send(qp, wr) != 0 || !poll_one(cq, &wc, Millis{15000})) return 20;
    if (wc.status != IBV_WC_SUCCESS) break;
    if (sent == 10 && !write_all(wfd, "G", 1)) return 21;
  }
  const uint32_t status = wc.status;
  if (!write_all(wfd, &status, sizeof status)) return 22;
  char quit = 0;
  if (!read_all(rfd, &quit, 1, Millis{15000}) || quit != 'Q') return 40;
  return 0;
}

struct StreamParam {
  uint64_t tag;
  const char* name;
};

class TmDestroyFence : public ::testing::TestWithParam<StreamParam> {};

// While the child streams, b (every tag of the list posted for the listed
// tag, every ordinary WQE posted) is destroyed: its SRQ refuses to go
// first, nothing lands in the tagged or ordinary buffers once
// ibv_destroy_qp returned, and the sender's next SEND fails.
TEST_P(TmDestroyFence, NothingLandsAfterTheQpIsDestroyed) {
  const uint64_t tag = GetParam().tag;
  Child child([tag](int r, int w) { return eager_stream_child(r, w, tag); });
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr_ex caps{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &caps), 0);
  const uint32_t max_tags = caps.tm_caps.max_num_tags;
  ibv_cq_ex* cq = create_tm_cq(dev.ctx, 2 * (max_tags + kOrdinaryWqes));
  ASSERT_NE(cq, nullptr);
  ibv_srq* srq = create_tm_srq(dev.ctx, dev.pd, cq, max_tags, kOrdinaryWqes);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  ibv_qp* b = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), QpConfig{}, srq);
  ASSERT_NE(b, nullptr);
  {
    Buffer tagged(dev.pd, size_t{max_tags} * kStreamMessage);
    Buffer ordinary(dev.pd, size_t{kOrdinaryWqes} * kStreamMessage);
    for (uint32_t i = 0; i < max_tags; ++i) {
      ibv_sge sge = tagged.sge(size_t{i} * kStreamMessage, kStreamMessage);
      ibv_ops_wr op{};
      op.opcode = IBV_WR_TAG_ADD;
      op.tm.add.recv_wr_id = i;
      op.tm.add.sg_list = &sge;
      op.tm.add.num_sge = 1;
      op.tm.add.tag = kListedTag;
      op.tm.add.mask = ~0ull;
      ibv_ops_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    }
    for (uint32_t i = 0; i < kOrdinaryWqes; ++i) {
      ibv_sge sge = ordinary.sge(size_t{i} * kStreamMessage, kStreamMessage);
      ibv_recv_wr wr{};
      wr.wr_id = 10000 + i;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
    }
    ASSERT_EQ(qp_to_init(b, QpConfig{}), 0);
    ASSERT_TRUE(connect_over_pipes(b, dev.gid, QpConfig{}, child.rfd, child.wfd));
    char going = 0;
    ASSERT_TRUE(read_all(child.rfd, &going, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
    ASSERT_EQ(ibv_destroy_qp(b), 0);
    std::memset(tagged.data(), kAfterDestroy, size_t{max_tags} * kStreamMessage);
    std::memset(ordinary.data(), kAfterDestroy, size_t{kOrdinaryWqes} * kStreamMessage);
    uint32_t status = 0;
    ASSERT_TRUE(read_all(child.rfd, &status, sizeof status, Millis{15000}))
        << "the sender never failed; child exited with " << child.wait_exit(Millis{100});
    EXPECT_EQ(status, uint32_t{IBV_WC_RETRY_EXC_ERR}) << "the sender's first SEND after destroy";
    EXPECT_EQ(first_not(tagged.span(0, size_t{max_tags} * kStreamMessage), kAfterDestroy), -1)
        << "a message landed in a tagged buffer after ibv_destroy_qp returned";
    EXPECT_EQ(first_not(ordinary.span(0, size_t{kOrdinaryWqes} * kStreamMessage), kAfterDestroy), -1)
        << "a message landed in an ordinary WQE after ibv_destroy_qp returned";
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
  }
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kDeadline), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

INSTANTIATE_TEST_SUITE_P(Streams, TmDestroyFence,
                         ::testing::Values(StreamParam{kListedTag, "Tagged"}, StreamParam{kUnlistedTag, "Unexpected"}),
                         [](const ::testing::TestParamInfo<StreamParam>& info) { return info.param.name; });

// Sends one RNDV of tag 0x33 for 200 bytes of its memory, says 'S' when its
// SEND completed, and waits to be killed.
int rndv_then_wait_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = cq ? create_qp(dev.pd, cq, cq, cfg) : nullptr;
  if (!qp) return 11;
  Buffer buf(dev.pd, 2 * kBytes);
  if (!buf.mr() || qp_to_init(qp, cfg) != 0 || !connect_over_pipes(qp, dev.gid, cfg, rfd, wfd)) return 12;
  fill_pattern(buf.span(kBytes, 200), 6);
  write_tmh(buf.data(), IBV_TMH_RNDV, 0x33, 7);
  write_be(buf.data() + 16, 8, buf.addr(kBytes));
  write_be(buf.data() + 24, 4, buf.rkey());
  write_be(buf.data() + 28, 4, 200);
  ibv_sge sge = buf.sge(0, 64);
  ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
  ibv_wc wc{};
  if (post_send(qp, wr) != 0 || !poll_one(cq, &wc, Millis{15000}) || wc.status != IBV_WC_SUCCESS) return 20;
  if (!write_all(wfd, "S", 1)) return 21;
  char c;
  read_all(rfd, &c, 1, Millis{30000});  // killed meanwhile
  return 50;
}

// An unexpected RNDV lands whole in an ordinary WQE; software then READs
// the data itself from the range its header names (as MPI libraries do).
// The sender was killed before that READ: it ends in RETRY_EXC_ERR within
// the QP's retries, and the QP goes to ERROR, never a hang.
TEST(TagMatchingProcesses, ReadOfAKilledSendersRendezvousFails) {
  Child child(rndv_then_wait_child);
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.timeout = 8;  // 1 ms
  cfg.retry_cnt = 2;
  ibv_cq_ex* cq = create_tm_cq(dev.ctx);
  ASSERT_NE(cq, nullptr);
  ibv_srq* srq = create_tm_srq(dev.ctx, dev.pd, cq);
  ASSERT_NE(srq, nullptr);
  ibv_qp* b = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), cfg, srq);
  ASSERT_NE(b, nullptr);
  {
    Buffer b_buf(dev.pd, 2 * kBytes);
    ibv_sge rsge = b_buf.sge(0, kBytes);
    ibv_recv_wr rwr{};
    rwr.wr_id = 9;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &rwr, &rbad), 0);
    ASSERT_EQ(qp_to_init(b, cfg), 0);
    ASSERT_TRUE(connect_over_pipes(b, dev.gid, cfg, child.rfd, child.wfd));
    char sent = 0;
    ASSERT_TRUE(read_all(child.rfd, &sent, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    ExWc wc;
    ASSERT_TRUE(poll_ex(cq, wc));
    EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
    EXPECT_EQ(wc.wr_id, 9u);
    EXPECT_EQ(wc.wc_flags, 0u);  // unexpected: no tag was posted
    ASSERT_EQ(wc.byte_len, 64u);
    const uint8_t* rvh = b_buf.data() + 16;
    uint64_t va = 0;
    uint32_t rkey = 0, length = 0;
    for (int i = 0; i < 8; ++i) va = (va << 8) | rvh[i];
    for (int i = 8; i < 12; ++i) rkey = (rkey << 8) | rvh[i];
    for (int i = 12; i < 16; ++i) length = (length << 8) | rvh[i];
    ASSERT_EQ(length, 200u);
    child.kill_now();
    ibv_sge sge = b_buf.sge(kBytes, length);
    ibv_send_wr wr = make_wr(2, IBV_WR_RDMA_READ, &sge, 1);
    wr.wr.rdma.remote_addr = va;
    wr.wr.rdma.rkey = rkey;
    const auto start = Clock::now();
    ASSERT_EQ(post_send(b, wr), 0);
    ASSERT_TRUE(poll_ex(cq, wc)) << "the READ from a dead sender never completed";
    EXPECT_LT(Clock::now() - start, Millis{3000});
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_EQ(qp_state(b), IBV_QPS_ERR);
  }
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// The list's lock is taken by whichever process matches a message; a
// sender killed while it holds it must not stop the list's owner. Rounds
// of: a sender streams EAGERs that each walk a full list (the oldest
// matching entry wins, so every match looks at every entry), is killed at
// a changing moment (so that some kills land inside a walk), then the
// owner runs list operations. A lock that a dead process held forever
// would hang the owner: the operations run on a thread of their own, and
// one that does not return in time fails the test (and ends the process,
// since that thread cannot be stopped).
TEST(TagMatchingProcesses, ASenderKilledWhileMatchingDoesNotStopTheOwner) {
  for (int round = 0; round < 30 && !::testing::Test::HasFailure(); ++round) {
    SCOPED_TRACE(round);
    Child child([](int r, int w) { return eager_stream_child(r, w, kListedTag); });
    ASSERT_TRUE(child.ok());
    Device dev;  // after the fork: the child opens its own
    ASSERT_TRUE(dev.ok());
    ibv_device_attr_ex caps{};
    ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &caps), 0);
    const uint32_t max_tags = caps.tm_caps.max_num_tags;
    Buffer tagged(dev.pd, size_t{max_tags} * kStreamMessage);
    ibv_cq_ex* cq = create_tm_cq(dev.ctx, 2 * max_tags);
    ASSERT_NE(cq, nullptr);
    ibv_srq* srq = create_tm_srq(dev.ctx, dev.pd, cq, max_tags);
    ASSERT_NE(srq, nullptr);
    auto add = [&](uint32_t i) {
      ibv_sge sge = tagged.sge(size_t{i} * kStreamMessage, kStreamMessage);
      ibv_ops_wr op{};
      op.opcode = IBV_WR_TAG_ADD;
      op.tm.add.sg_list = &sge;
      op.tm.add.num_sge = 1;
      op.tm.add.tag = kListedTag;
      op.tm.add.mask = ~0ull;
      ibv_ops_wr* bad = nullptr;
      return ibv_post_srq_ops(srq, &op, &bad);
    };
    for (uint32_t i = 0; i < max_tags; ++i) ASSERT_EQ(add(i), 0);
    ibv_qp* b = create_qp(dev.pd, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), QpConfig{}, srq);
    ASSERT_NE(b, nullptr);
    ASSERT_EQ(qp_to_init(b, QpConfig{}), 0);
    ASSERT_TRUE(connect_over_pipes(b, dev.gid, QpConfig{}, child.rfd, child.wfd));
    char going = 0;
    ASSERT_TRUE(read_all(child.rfd, &going, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    // A different moment each round, up to some hundred walks later.
    const auto kill_at = Clock::now() + std::chrono::microseconds(round * 41);
    while (Clock::now() < kill_at) {
    }
    child.kill_now();
    std::atomic<bool> done{false};
    int sync_rc = -1, add_rc = -1;
    std::thread owner([&] {
      ibv_ops_wr sync{};
      sync.opcode = IBV_WR_TAG_SYNC;
      ibv_ops_wr* bad = nullptr;
      sync_rc = ibv_post_srq_ops(srq, &sync, &bad);
      add_rc = add(0);  // ten or more messages took entries: there is room
      done = true;
    });
    const auto until = Clock::now() + kDeadline;
    while (!done.load() && Clock::now() < until) std::this_thread::yield();
    if (!done.load()) {
      ADD_FAILURE() << "ibv_post_srq_ops hangs on the list lock the killed sender held";
      std::fflush(nullptr);
      ::_exit(1);
    }
    owner.join();
    EXPECT_EQ(sync_rc, 0);
    EXPECT_EQ(add_rc, 0);
    EXPECT_EQ(ibv_destroy_qp(b), 0);
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  }
}

}  // namespace
}  // namespace loopback
