// The extended verbs as an application uses them: ibv_create_cq_ex with the
// ibv_start_poll / ibv_next_poll / ibv_end_poll loop and the ibv_wc_read_*
// readers, and ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS and the
// new post-send API (ibv_wr_*). Two QPs in one process, public API only.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kDeadline{5000};

constexpr uint64_t kAllSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                                 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                                 IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
constexpr int kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kGrh = 40;

// One completion as the readers give it.
struct Completion {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len;
  uint32_t imm_data;  // host order
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned wc_flags;
  uint32_t vendor_err;
};

Completion read_current(ibv_cq_ex* cq) {
  Completion c{};
  c.wr_id = cq->wr_id;
  c.status = cq->status;
  c.opcode = ibv_wc_read_opcode(cq);
  c.byte_len = ibv_wc_read_byte_len(cq);
  c.wc_flags = ibv_wc_read_wc_flags(cq);
  c.imm_data = (c.wc_flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
  c.qp_num = ibv_wc_read_qp_num(cq);
  c.src_qp = ibv_wc_read_src_qp(cq);
  c.vendor_err = ibv_wc_read_vendor_err(cq);
  (void)ibv_wc_read_slid(cq);
  (void)ibv_wc_read_sl(cq);
  (void)ibv_wc_read_dlid_path_bits(cq);
  return c;
}

// Polls `n` completions with the extended API, giving up at the deadline.
std::vector<Completion> poll_ex(ibv_cq_ex* cq, size_t n) {
  std::vector<Completion> out;
  if (n == 0) return out;
  const auto deadline = Clock::now() + kDeadline;
  ibv_poll_cq_attr attr{};
  int rc;
  while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && Clock::now() < deadline) {
  }
  if (rc != 0) {
    ADD_FAILURE() << "ibv_start_poll: " << rc;
    return out;
  }
  out.push_back(read_current(cq));
  while (out.size() < n && Clock::now() < deadline) {
    rc = ibv_next_poll(cq);
    if (rc == ENOENT) continue;
    if (rc != 0) {
      ADD_FAILURE() << "ibv_next_poll: " << rc;
      break;
    }
    out.push_back(read_current(cq));
  }
  ibv_end_poll(cq);
  EXPECT_EQ(out.size(), n) << "timed out polling";
  return out;
}

// Nothing more arrives for a short while.
void expect_empty(ibv_cq_ex* cq) {
  ibv_poll_cq_attr attr{};
  const auto until = Clock::now() + std::chrono::milliseconds(20);
  while (Clock::now() < until) {
    const int rc = ibv_start_poll(cq, &attr);
    if (rc == 0) {
      ADD_FAILURE() << "unexpected completion wr_id " << cq->wr_id << " status " << cq->status;
      ibv_end_poll(cq);
      return;
    }
    ASSERT_EQ(rc, ENOENT);
  }
}

class Device {
 public:
  Device() {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (list == nullptr) return;
    if (num > 0) ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) return;
    pd = ibv_alloc_pd(ctx);
    ibv_query_gid(ctx, 1, 0, &gid);
  }
  ~Device() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};
};

ibv_cq_ex* create_cq_ex(ibv_context* ctx, uint64_t wc_flags = IBV_WC_STANDARD_FLAGS, uint32_t cqe = 256) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = cqe;
  attr.wc_flags = wc_flags;
  return ibv_create_cq_ex(ctx, &attr);
}

struct QpCaps {
  uint32_t max_send_wr = 32;
  uint32_t max_send_sge = 4;
  uint32_t max_inline_data = 64;
};

ibv_qp* create_qp_ex(ibv_pd* pd, ibv_cq_ex* cq, ibv_qp_type type, uint64_t send_ops, QpCaps caps = {},
                     uint32_t extra_mask = 0, uint32_t create_flags = 0) {
  ibv_qp_init_attr_ex attr{};
  attr.qp_type = type;
  attr.send_cq = ibv_cq_ex_to_cq(cq);
  attr.recv_cq = ibv_cq_ex_to_cq(cq);
  attr.cap.max_send_wr = caps.max_send_wr;
  attr.cap.max_recv_wr = 32;
  attr.cap.max_send_sge = caps.max_send_sge;
  attr.cap.max_recv_sge = 4;
  attr.cap.max_inline_data = caps.max_inline_data;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | extra_mask;
  attr.pd = pd;
  attr.send_ops_flags = send_ops;
  attr.create_flags = create_flags;
  return ibv_create_qp_ex(pd->context, &attr);
}

int to_init(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (qp->qp_type == IBV_QPT_UD) {
    a.qkey = kQkey;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  }
  a.qp_access_flags = kAllAccess;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int to_rts(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& dgid) {
  if (int rc = to_init(qp)) return rc;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  if (qp->qp_type == IBV_QPT_UD) {
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
    a.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  if (int rc = ibv_modify_qp(qp, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 4;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

int post_recv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t length, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(addr), length, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// ---------------------------------------------------------------------------
// ibv_create_cq_ex

class CqEx : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(dev.pd, nullptr); }
  Device dev;
};

TEST_F(CqEx, CreatesWithStandardFlagsAndEveryPointerSet) {
  ibv_cq_ex* cq = create_cq_ex(dev.ctx);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_EQ(cq->context, dev.ctx);
  EXPECT_GE(cq->cqe, 256);
  EXPECT_NE(cq->start_poll, nullptr);
  EXPECT_NE(cq->next_poll, nullptr);
  EXPECT_NE(cq->end_poll, nullptr);
  EXPECT_NE(cq->read_opcode, nullptr);
  EXPECT_NE(cq->read_vendor_err, nullptr);
  EXPECT_NE(cq->read_byte_len, nullptr);
  EXPECT_NE(cq->read_imm_data, nullptr);
  EXPECT_NE(cq->read_qp_num, nullptr);
  EXPECT_NE(cq->read_src_qp, nullptr);
  EXPECT_NE(cq->read_wc_flags, nullptr);
  EXPECT_NE(cq->read_slid, nullptr);
  EXPECT_NE(cq->read_sl, nullptr);
  EXPECT_NE(cq->read_dlid_path_bits, nullptr);
  EXPECT_NE(cq->read_completion_ts, nullptr);
  EXPECT_NE(cq->read_cvlan, nullptr);
  EXPECT_NE(cq->read_flow_tag, nullptr);
  EXPECT_NE(cq->read_tm_info, nullptr);
  EXPECT_NE(cq->read_completion_wallclock_ns, nullptr);
  // Empty: ENOENT, and end_poll is not needed (a stray one is harmless).
  ibv_poll_cq_attr attr{};
  EXPECT_EQ(ibv_start_poll(cq, &attr), ENOENT);
  ibv_end_poll(cq);
  EXPECT_EQ(ibv_start_poll(cq, &attr), ENOENT);
  // The legacy verbs work on it through the cast.
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc), 0);
  EXPECT_EQ(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

TEST_F(CqEx, EachStandardWcFlagAndSingleThreaded) {
  for (uint64_t flag = 1; flag <= IBV_WC_EX_WITH_DLID_PATH_BITS; flag <<= 1) {
    ibv_cq_ex* cq = create_cq_ex(dev.ctx, flag, 10);
    ASSERT_NE(cq, nullptr) << "wc flag " << flag << ": " << std::strerror(errno);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  }
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 10;
  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &attr);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  ibv_poll_cq_attr pattr{};
  EXPECT_EQ(ibv_start_poll(cq, &pattr), ENOENT);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

TEST_F(CqEx, UnsupportedFlagsAreEopnotsupp) {
  for (uint64_t flag : {IBV_WC_EX_WITH_CVLAN, IBV_WC_EX_WITH_FLOW_TAG}) {
    errno = 0;
    EXPECT_EQ(create_cq_ex(dev.ctx, flag), nullptr) << "wc flag " << flag;
    EXPECT_EQ(errno, EOPNOTSUPP) << "wc flag " << flag;
  }
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 10;
  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  attr.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  attr = {};
  attr.cqe = 10;
  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;  // a CQ belongs to parent domains only
  attr.parent_domain = dev.pd;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CqEx, BadCqeAndCompVectorAreEinval) {
  ibv_device_attr dattr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &dattr), 0);
  errno = 0;
  EXPECT_EQ(create_cq_ex(dev.ctx, 0, static_cast<uint32_t>(dattr.max_cqe) + 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(create_cq_ex(dev.ctx, 0, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 10;
  attr.comp_vector = static_cast<uint32_t>(dev.ctx->num_comp_vectors) + 1;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CqEx, CompletionChannelAndContextAreKept) {
  ibv_comp_channel* ch = ibv_create_comp_channel(dev.ctx);
  ASSERT_NE(ch, nullptr);
  int cookie = 0;
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.channel = ch;
  attr.cq_context = &cookie;
  attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &attr);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_EQ(cq->channel, ch);
  EXPECT_EQ(cq->cq_context, &cookie);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// ---------------------------------------------------------------------------
// ibv_create_qp_ex with SEND_OPS_FLAGS

class QpExCreate : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(dev.pd, nullptr);
    cq = create_cq_ex(dev.ctx);
    ASSERT_NE(cq, nullptr);
  }
  void TearDown() override {
    if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
  }
  Device dev;
  ibv_cq_ex* cq = nullptr;
};

TEST_F(QpExCreate, SupportedSendOpsGiveAnExtendedQp) {
  ibv_qp* qp = create_qp_ex(dev.pd, cq, IBV_QPT_RC, kAllSendOps);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(qpx, nullptr);
  EXPECT_EQ(static_cast<void*>(qpx), static_cast<void*>(qp));
  EXPECT_EQ(&qpx->qp_base, qp);
  for (auto fn : {reinterpret_cast<void*>(qpx->wr_start), reinterpret_cast<void*>(qpx->wr_complete),
                  reinterpret_cast<void*>(qpx->wr_abort), reinterpret_cast<void*>(qpx->wr_send),
                  reinterpret_cast<void*>(qpx->wr_send_imm), reinterpret_cast<void*>(qpx->wr_send_inv),
                  reinterpret_cast<void*>(qpx->wr_send_tso), reinterpret_cast<void*>(qpx->wr_rdma_write),
                  reinterpret_cast<void*>(qpx->wr_rdma_write_imm), reinterpret_cast<void*>(qpx->wr_rdma_read),
                  reinterpret_cast<void*>(qpx->wr_atomic_cmp_swp), reinterpret_cast<void*>(qpx->wr_atomic_fetch_add),
                  reinterpret_cast<void*>(qpx->wr_bind_mw), reinterpret_cast<void*>(qpx->wr_local_inv),
                  reinterpret_cast<void*>(qpx->wr_atomic_write), reinterpret_cast<void*>(qpx->wr_set_sge),
                  reinterpret_cast<void*>(qpx->wr_set_sge_list), reinterpret_cast<void*>(qpx->wr_set_inline_data),
                  reinterpret_cast<void*>(qpx->wr_set_inline_data_list),
                  reinterpret_cast<void*>(qpx->wr_set_ud_addr), reinterpret_cast<void*>(qpx->wr_set_xrc_srqn)})
    EXPECT_NE(fn, nullptr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);

  // UC and UD with what they allow; create_flags 0 is accepted.
  qp = create_qp_ex(dev.pd, cq, IBV_QPT_UC,
                    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_NE(ibv_qp_to_qp_ex(qp), nullptr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  qp = create_qp_ex(dev.pd, cq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, {},
                    IBV_QP_INIT_ATTR_CREATE_FLAGS, 0);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_NE(ibv_qp_to_qp_ex(qp), nullptr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(QpExCreate, LegacyQpHasNoExtendedQp) {
  ibv_qp_init_attr init{};
  init.send_cq = ibv_cq_ex_to_cq(cq);
  init.recv_cq = ibv_cq_ex_to_cq(cq);
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(dev.pd, &init);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(qp), nullptr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(QpExCreate, UnsupportedSendOpsAreEopnotsupp) {
  for (uint64_t op : {static_cast<uint64_t>(IBV_QP_EX_WITH_TSO),
                      uint64_t{1} << 11 /* FLUSH, newer headers */,
                      uint64_t{1} << 40}) {
    errno = 0;
    EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_RC, IBV_QP_EX_WITH_SEND | op), nullptr) << "op " << op;
    EXPECT_EQ(errno, EOPNOTSUPP) << "op " << op;
  }
  // Per QP type: no RDMA or atomics on UD, no READ or atomics on UC.
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_UC, IBV_QP_EX_WITH_SEND_WITH_INV), nullptr);  // RC only
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_UD, IBV_QP_EX_WITH_BIND_MW), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // Creation flags other than 0.
  errno = 0;
  EXPECT_EQ(create_qp_ex(dev.pd, cq, IBV_QPT_RC, IBV_QP_EX_WITH_SEND, {}, IBV_QP_INIT_ATTR_CREATE_FLAGS,
                         IBV_QP_CREATE_SCATTER_FCS),
            nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

// ---------------------------------------------------------------------------
// RC traffic through the new post-send API

class RcPair : public ::testing::Test {
 protected:
  static constexpr size_t kBuf = 4096;

  virtual uint64_t wc_flags() const { return IBV_WC_STANDARD_FLAGS; }

  void SetUp() override {
    ASSERT_NE(dev.pd, nullptr);
    cq_a = create_cq_ex(dev.ctx, wc_flags());
    cq_b = create_cq_ex(dev.ctx, wc_flags());
    ASSERT_NE(cq_a, nullptr);
    ASSERT_NE(cq_b, nullptr);
    a = create_qp_ex(dev.pd, cq_a, IBV_QPT_RC, kAllSendOps | IBV_QP_EX_WITH_ATOMIC_WRITE);
    b = create_qp_ex(dev.pd, cq_b, IBV_QPT_RC, kAllSendOps | IBV_QP_EX_WITH_ATOMIC_WRITE);
    ASSERT_NE(a, nullptr) << std::strerror(errno);
    ASSERT_NE(b, nullptr) << std::strerror(errno);
    ax = ibv_qp_to_qp_ex(a);
    ASSERT_NE(ax, nullptr);
    buf_a.assign(kBuf, 0);
    buf_b.assign(kBuf, 0);
    mr_a = ibv_reg_mr(dev.pd, buf_a.data(), kBuf, kAllAccess);
    mr_b = ibv_reg_mr(dev.pd, buf_b.data(), kBuf, kAllAccess);
    ASSERT_NE(mr_a, nullptr);
    ASSERT_NE(mr_b, nullptr);
  }
  void connect() {
    ASSERT_EQ(to_rts(a, b->qp_num, dev.gid), 0);
    ASSERT_EQ(to_rts(b, a->qp_num, dev.gid), 0);
  }
  void TearDown() override {
    if (a) ibv_destroy_qp(a);
    if (b) ibv_destroy_qp(b);
    if (mr_a) ibv_dereg_mr(mr_a);
    if (mr_b) ibv_dereg_mr(mr_b);
    if (cq_a) ibv_destroy_cq(ibv_cq_ex_to_cq(cq_a));
    if (cq_b) ibv_destroy_cq(ibv_cq_ex_to_cq(cq_b));
  }
  uint64_t addr_a(size_t off = 0) { return reinterpret_cast<uintptr_t>(buf_a.data() + off); }
  uint64_t addr_b(size_t off = 0) { return reinterpret_cast<uintptr_t>(buf_b.data() + off); }
  void fill(std::vector<uint8_t>& buf, size_t off, size_t len, uint8_t seed) {
    for (size_t i = 0; i < len; ++i) buf[off + i] = static_cast<uint8_t>(seed + i * 7);
  }

  Device dev;
  ibv_cq_ex* cq_a = nullptr;
  ibv_cq_ex* cq_b = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
  ibv_qp_ex* ax = nullptr;
  std::vector<uint8_t> buf_a, buf_b;
  ibv_mr* mr_a = nullptr;
  ibv_mr* mr_b = nullptr;
};

TEST_F(RcPair, SendAndSendImm) {
  connect();
  ASSERT_EQ(post_recv(b, 100, buf_b.data(), 1024, mr_b->lkey), 0);
  ASSERT_EQ(post_recv(b, 101, buf_b.data() + 1024, 1024, mr_b->lkey), 0);
  fill(buf_a, 0, 300, 1);
  fill(buf_a, 512, 200, 2);

  ibv_wr_start(ax);
  ax->wr_id = 1;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 300);
  ax->wr_id = 2;
  ax->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
  ibv_wr_send_imm(ax, htonl(0xabcd1234));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(512), 200);
  ASSERT_EQ(ibv_wr_complete(ax), 0);

  auto sent = poll_ex(cq_a, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].wr_id, 1u);
  EXPECT_EQ(sent[1].wr_id, 2u);
  for (const auto& c : sent) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.opcode, IBV_WC_SEND);
    EXPECT_EQ(c.qp_num, a->qp_num);
  }
  auto got = poll_ex(cq_b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 100u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, 300u);
  EXPECT_EQ(got[0].qp_num, b->qp_num);
  EXPECT_EQ(got[0].src_qp, a->qp_num);
  EXPECT_FALSE(got[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].wr_id, 101u);
  EXPECT_EQ(got[1].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[1].byte_len, 200u);
  EXPECT_TRUE(got[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].imm_data, 0xabcd1234u);
  EXPECT_EQ(std::memcmp(buf_b.data(), buf_a.data(), 300), 0);
  EXPECT_EQ(std::memcmp(buf_b.data() + 1024, buf_a.data() + 512, 200), 0);
}

TEST_F(RcPair, RdmaWriteWriteImmAndRead) {
  connect();
  fill(buf_a, 0, 256, 3);
  fill(buf_b, 2048, 128, 4);
  ASSERT_EQ(post_recv(b, 200, nullptr, 0, mr_b->lkey), 0);

  ibv_wr_start(ax);
  ax->wr_id = 10;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 128);
  ax->wr_id = 11;
  ibv_wr_rdma_write_imm(ax, mr_b->rkey, addr_b(128), htonl(77));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(128), 128);
  ax->wr_id = 12;
  ibv_wr_rdma_read(ax, mr_b->rkey, addr_b(2048));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(1024), 128);
  ASSERT_EQ(ibv_wr_complete(ax), 0);

  auto sent = poll_ex(cq_a, 3);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].wr_id, 10u);
  EXPECT_EQ(sent[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[1].wr_id, 11u);
  EXPECT_EQ(sent[1].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[2].wr_id, 12u);
  EXPECT_EQ(sent[2].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(sent[2].byte_len, 128u);
  for (const auto& c : sent) EXPECT_EQ(c.status, IBV_WC_SUCCESS);

  auto got = poll_ex(cq_b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 200u);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(got[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[0].imm_data, 77u);
  EXPECT_EQ(got[0].byte_len, 128u);
  EXPECT_EQ(std::memcmp(buf_b.data(), buf_a.data(), 256), 0);
  EXPECT_EQ(std::memcmp(buf_a.data() + 1024, buf_b.data() + 2048, 128), 0);
}

TEST_F(RcPair, Atomics) {
  connect();
  uint64_t target = 5;
  std::memcpy(buf_b.data() + 64, &target, 8);

  ibv_wr_start(ax);
  ax->wr_id = 20;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_fetch_add(ax, mr_b->rkey, addr_b(64), 10);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ax->wr_id = 21;
  ibv_wr_atomic_cmp_swp(ax, mr_b->rkey, addr_b(64), 15, 99);  // 5 + 10 == 15: swaps
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(8), 8);
  ax->wr_id = 22;
  ibv_wr_atomic_cmp_swp(ax, mr_b->rkey, addr_b(64), 15, 1234);  // 99 != 15: no swap
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(16), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);

  auto sent = poll_ex(cq_a, 3);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(sent[1].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(sent[2].opcode, IBV_WC_COMP_SWAP);
  for (const auto& c : sent) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.byte_len, 8u);
  }
  uint64_t old[3];
  std::memcpy(old, buf_a.data(), sizeof old);
  EXPECT_EQ(old[0], 5u);
  EXPECT_EQ(old[1], 15u);
  EXPECT_EQ(old[2], 99u);
  std::memcpy(&target, buf_b.data() + 64, 8);
  EXPECT_EQ(target, 99u);
}

TEST_F(RcPair, AtomicWriteLandsEightBytesWhole) {
  connect();
  uint64_t value = 0x1122334455667788ULL;
  ibv_wr_start(ax);
  ax->wr_id = 30;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(ax, mr_b->rkey, addr_b(64), &value);
  value = 0;  // taken when posted, not when executed
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(sent[0].byte_len, 8u);
  uint64_t landed = 0;
  std::memcpy(&landed, buf_b.data() + 64, 8);
  EXPECT_EQ(landed, 0x1122334455667788ULL);
  expect_empty(cq_b);  // one-sided: nothing on the responder's CQ

  // The legacy ibv_post_send has no field for the value: EINVAL.
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_ATOMIC_WRITE;
  wr.wr.atomic.remote_addr = addr_b(64);
  wr.wr.atomic.rkey = mr_b->rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);

  // Misaligned: an invalid request, as for the other atomics.
  ibv_wr_start(ax);
  ax->wr_id = 31;
  ibv_wr_atomic_write(ax, mr_b->rkey, addr_b(65), &value);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(RcPair, AtomicWriteNeedsRemoteWriteAccess) {
  connect();
  ibv_mr* read_only = ibv_reg_mr(dev.pd, buf_b.data(), kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(read_only, nullptr);
  const uint64_t value = 7;
  ibv_wr_start(ax);
  ax->wr_id = 32;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(ax, read_only->rkey, addr_b(0), &value);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dereg_mr(read_only), 0);
}

TEST_F(RcPair, InlineDataIsCopiedAtOnce) {
  connect();
  ASSERT_EQ(post_recv(b, 300, buf_b.data(), 1024, mr_b->lkey), 0);
  ASSERT_EQ(post_recv(b, 301, buf_b.data() + 1024, 1024, mr_b->lkey), 0);
  char msg[48];
  std::memset(msg, 'x', sizeof msg);
  char part1[10], part2[20];
  std::memset(part1, 'p', sizeof part1);
  std::memset(part2, 'q', sizeof part2);

  ibv_wr_start(ax);
  ax->wr_id = 30;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_inline_data(ax, msg, sizeof msg);
  std::memset(msg, 'y', sizeof msg);  // the copy is taken already
  ax->wr_id = 31;
  ibv_wr_send(ax);
  const ibv_data_buf bufs[2] = {{part1, sizeof part1}, {part2, sizeof part2}};
  ibv_wr_set_inline_data_list(ax, 2, bufs);
  std::memset(part1, 0, sizeof part1);
  ASSERT_EQ(ibv_wr_complete(ax), 0);

  auto sent = poll_ex(cq_a, 2);
  ASSERT_EQ(sent.size(), 2u);
  for (const auto& c : sent) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  auto got = poll_ex(cq_b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].byte_len, sizeof msg);
  EXPECT_EQ(got[1].byte_len, sizeof part1 + sizeof part2);
  for (size_t i = 0; i < sizeof msg; ++i) ASSERT_EQ(buf_b[i], 'x') << i;
  for (size_t i = 0; i < sizeof part1; ++i) ASSERT_EQ(buf_b[1024 + i], 'p') << i;
  for (size_t i = 0; i < sizeof part2; ++i) ASSERT_EQ(buf_b[1024 + sizeof part1 + i], 'q') << i;
}

TEST_F(RcPair, SgeListGathers) {
  connect();
  ASSERT_EQ(post_recv(b, 400, buf_b.data(), 1024, mr_b->lkey), 0);
  fill(buf_a, 0, 2048, 9);
  const ibv_sge sges[3] = {{addr_a(0), 100, mr_a->lkey}, {addr_a(1000), 50, mr_a->lkey}, {addr_a(2000), 25, mr_a->lkey}};
  ibv_wr_start(ax);
  ax->wr_id = 40;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge_list(ax, 3, sges);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  auto got = poll_ex(cq_b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 175u);
  EXPECT_EQ(std::memcmp(buf_b.data(), buf_a.data(), 100), 0);
  EXPECT_EQ(std::memcmp(buf_b.data() + 100, buf_a.data() + 1000, 50), 0);
  EXPECT_EQ(std::memcmp(buf_b.data() + 150, buf_a.data() + 2000, 25), 0);
}

TEST_F(RcPair, UnsignaledWrsCompleteSilentlyAndOrderHolds) {
  connect();
  ibv_wr_start(ax);
  for (uint64_t i = 0; i < 8; ++i) {
    ax->wr_id = 50 + i;
    ax->wr_flags = (i % 2 == 1) ? IBV_SEND_SIGNALED : 0;
    ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(i * 8));
    ibv_wr_set_sge(ax, mr_a->lkey, addr_a(i * 8), 8);
  }
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 4);
  ASSERT_EQ(sent.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sent[i].wr_id, 51 + 2 * i);
    EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS);
  }
  expect_empty(cq_a);
}

TEST_F(RcPair, AbortPostsNothing) {
  connect();
  ibv_wr_start(ax);
  ax->wr_id = 60;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ibv_wr_abort(ax);
  expect_empty(cq_a);
  // The QP goes on working; a second wr_start after abort does not block.
  ibv_wr_start(ax);
  ax->wr_id = 61;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 61u);
}

TEST_F(RcPair, SecondStartOnTheSameThreadRestartsTheBatch) {
  connect();
  ibv_wr_start(ax);
  ax->wr_id = 62;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ibv_wr_start(ax);  // neither deadlocks nor keeps WR 62
  ax->wr_id = 63;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 63u);
  expect_empty(cq_a);
}

// wr_start..wr_complete holds the QP's batch: threads sharing a QP take turns.
TEST_F(RcPair, ThreadsSharingAQpTakeTurns) {
  connect();
  constexpr int kThreads = 4;
  // 32 completions: the send queue's depth, as none is polled until the end
  // (a slot stays taken until its completion is polled).
  constexpr int kBatches = 8;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBatches; ++i) {
        ibv_wr_start(ax);
        ax->wr_id = static_cast<uint64_t>(t) << 32 | static_cast<uint64_t>(i);
        ax->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(static_cast<size_t>(t) * 8));
        ibv_wr_set_sge(ax, mr_a->lkey, addr_a(static_cast<size_t>(t) * 8), 8);
        if (ibv_wr_complete(ax) != 0) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto sent = poll_ex(cq_a, kThreads * kBatches);
  ASSERT_EQ(sent.size(), static_cast<size_t>(kThreads * kBatches));
  std::vector<int> next(kThreads, 0);
  for (const auto& c : sent) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    const auto t = static_cast<size_t>(c.wr_id >> 32);
    ASSERT_LT(t, next.size());
    EXPECT_EQ(static_cast<int>(c.wr_id & 0xffffffffu), next[t]++) << "thread " << t;  // per-thread order kept
  }
}

TEST_F(RcPair, LegacyAndNewPostMix) {
  connect();
  ibv_sge sge{addr_a(0), 8, mr_a->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 70;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr_b(0);
  wr.wr.rdma.rkey = mr_b->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  ibv_wr_start(ax);
  ax->wr_id = 71;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(8));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(8), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  // Legacy ibv_poll_cq on the same ibv_cq_ex.
  ibv_wc wc[2];
  int n = 0;
  const auto deadline = Clock::now() + kDeadline;
  while (n < 2 && Clock::now() < deadline) n += ibv_poll_cq(ibv_cq_ex_to_cq(cq_a), 2 - n, wc + n);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(wc[0].wr_id, 70u);
  EXPECT_EQ(wc[1].wr_id, 71u);
}

TEST_F(RcPair, RemoteAccessErrorReportsThroughReaders) {
  connect();
  ibv_wr_start(ax);
  ax->wr_id = 80;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey ^ 0x5a5a00, addr_b(0));  // not a valid rkey
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto sent = poll_ex(cq_a, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 80u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_ACCESS_ERR);
}

// Bad flows: errors are reported by wr_complete, and nothing is posted.

TEST_F(RcPair, CompleteInWrongStateIsEinval) {
  // RESET
  ibv_wr_start(ax);
  ax->wr_id = 90;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  // INIT
  ASSERT_EQ(to_init(a), 0);
  ibv_wr_start(ax);
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  expect_empty(cq_a);
}

TEST_F(RcPair, CompleteWithoutStartIsEinval) { EXPECT_EQ(ibv_wr_complete(ax), EINVAL); }

TEST_F(RcPair, BuildErrorsComeBackFromComplete) {
  connect();
  // More SGEs than max_send_sge.
  std::vector<ibv_sge> sges(5, ibv_sge{addr_a(0), 8, mr_a->lkey});
  ibv_wr_start(ax);
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge_list(ax, sges.size(), sges.data());
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  // More inline data than the max_inline_data granted (which may exceed the 64 asked for).
  ibv_qp_attr qattr{};
  ibv_qp_init_attr qinit{};
  ASSERT_EQ(ibv_query_qp(a, &qattr, IBV_QP_CAP, &qinit), 0);
  ASSERT_GE(qattr.cap.max_inline_data, 64u);
  std::vector<char> big(qattr.cap.max_inline_data + 1, 'z');
  ibv_wr_start(ax);
  ibv_wr_send(ax);
  ibv_wr_set_inline_data(ax, big.data(), big.size());
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  // A setter before any opcode.
  ibv_wr_start(ax);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  // More WRs in one batch than the send queue holds.
  ibv_wr_start(ax);
  for (int i = 0; i < 33; ++i) {
    ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
    ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 8);
  }
  EXPECT_EQ(ibv_wr_complete(ax), ENOMEM);
  // Operations this device does not offer.
  ibv_wr_start(ax);
  ibv_wr_send_tso(ax, nullptr, 0, 0);
  EXPECT_EQ(ibv_wr_complete(ax), EOPNOTSUPP);
  ibv_wr_start(ax);
  ibv_wr_send(ax);
  ibv_wr_set_xrc_srqn(ax, 7);  // an RC QP names no SRQ
  EXPECT_EQ(ibv_wr_complete(ax), EOPNOTSUPP);
  // Nothing of the above reached the wire.
  expect_empty(cq_a);
  expect_empty(cq_b);
  // An empty batch is fine.
  ibv_wr_start(ax);
  EXPECT_EQ(ibv_wr_complete(ax), 0);
}

// ---------------------------------------------------------------------------
// UD with wr_set_ud_addr

// ---------------------------------------------------------------------------
// Thread and parent domains: a parent domain stands for its PD everywhere.

void* never_called_alloc(ibv_pd*, void*, size_t, size_t, uint64_t) { return IBV_ALLOCATOR_USE_DEFAULT; }
void never_called_free(ibv_pd*, void*, void*, uint64_t) {}

TEST(ParentDomain, CarriesTrafficAndPinsItsPdAndTd) {
  Device dev;
  ASSERT_NE(dev.pd, nullptr);
  ibv_td_init_attr td_attr{};
  td_attr.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_td(dev.ctx, &td_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  td_attr.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(dev.ctx, &td_attr);
  ASSERT_NE(td, nullptr) << std::strerror(errno);

  ibv_parent_domain_init_attr pd_attr{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &pd_attr), nullptr);  // no PD
  EXPECT_EQ(errno, EINVAL);
  pd_attr.pd = dev.pd;
  pd_attr.td = td;
  pd_attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pd_attr.alloc = never_called_alloc;
  pd_attr.free = never_called_free;
  pd_attr.pd_context = &pd_attr;
  ibv_pd* parent = ibv_alloc_parent_domain(dev.ctx, &pd_attr);
  ASSERT_NE(parent, nullptr) << std::strerror(errno);
  EXPECT_EQ(parent->context, dev.ctx);
  pd_attr.pd = parent;  // a parent of a parent
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &pd_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(dev.pd), EBUSY);
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);

  // A CQ of the parent domain, MRs and QPs made through it, a SEND between them.
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 16;
  cq_attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cq_attr.parent_domain = parent;
  ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &cq_attr);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  std::vector<uint8_t> buf(256, 0);
  ibv_mr* mr = ibv_reg_mr(parent, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(mr->pd, parent);
  ibv_qp* a = create_qp_ex(parent, cq, IBV_QPT_RC, kAllSendOps);
  ibv_qp* b = create_qp_ex(parent, cq, IBV_QPT_RC, kAllSendOps);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  EXPECT_EQ(a->pd, parent);
  ASSERT_EQ(to_rts(a, b->qp_num, dev.gid), 0);
  ASSERT_EQ(to_rts(b, a->qp_num, dev.gid), 0);
  ASSERT_EQ(post_recv(b, 7, buf.data() + 128, 128, mr->lkey), 0);
  std::memcpy(buf.data(), "parent domain", 14);
  ibv_qp_ex* ax = ibv_qp_to_qp_ex(a);
  ibv_wr_start(ax);
  ax->wr_id = 8;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, mr->lkey, reinterpret_cast<uintptr_t>(buf.data()), 14);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  auto done = poll_ex(cq, 2);
  ASSERT_EQ(done.size(), 2u);
  for (const auto& c : done) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<const char*>(buf.data() + 128), "parent domain");

  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
  // The Device destructor deallocates the PD itself, now free.
}

// ---------------------------------------------------------------------------
// Completion timestamps: the device's free-running clock, in ns of the host's
// CLOCK_MONOTONIC (hca_core_clock 1 GHz, a 64-bit mask).

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The next completion's wr_id and timestamp.
std::pair<uint64_t, uint64_t> poll_timestamp(ibv_cq_ex* cq) {
  ibv_poll_cq_attr attr{};
  const auto deadline = Clock::now() + kDeadline;
  int rc;
  while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && Clock::now() < deadline) {
  }
  if (rc != 0) {
    ADD_FAILURE() << "ibv_start_poll: " << rc;
    return {0, 0};
  }
  EXPECT_EQ(cq->status, IBV_WC_SUCCESS);
  const std::pair<uint64_t, uint64_t> got{cq->wr_id, ibv_wc_read_completion_ts(cq)};
  ibv_end_poll(cq);
  return got;
}

class RcPairTimestamped : public RcPair {
 protected:
  uint64_t wc_flags() const override {
    return uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
  }
};

TEST_F(RcPairTimestamped, CompletionsCarryTheDeviceClock) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &attr), 0);
  EXPECT_EQ(attr.completion_timestamp_mask, UINT64_MAX);
  EXPECT_EQ(attr.hca_core_clock, 1'000'000u);  // kHz

  connect();
  ASSERT_EQ(post_recv(b, 100, buf_b.data(), 64, mr_b->lkey), 0);
  const uint64_t before = monotonic_ns();
  ibv_wr_start(ax);
  ax->wr_id = 1;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 64);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  const auto [send_id, send_ts] = poll_timestamp(cq_a);
  const auto [recv_id, recv_ts] = poll_timestamp(cq_b);
  const uint64_t after = monotonic_ns();
  EXPECT_EQ(send_id, 1u);
  EXPECT_EQ(recv_id, 100u);
  EXPECT_GE(send_ts, before);
  EXPECT_LE(send_ts, after);
  EXPECT_GE(recv_ts, before);
  EXPECT_LE(recv_ts, after);
  // The receive is written before the send completes.
  EXPECT_LE(recv_ts, send_ts);

  // The same clock, read directly.
  ibv_values_ex values{};
  values.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  const uint64_t t0 = monotonic_ns();
  ASSERT_EQ(ibv_query_rt_values_ex(dev.ctx, &values), 0);
  const uint64_t t1 = monotonic_ns();
  EXPECT_EQ(values.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
  const uint64_t raw = static_cast<uint64_t>(values.raw_clock.tv_sec) * 1'000'000'000ULL +
                       static_cast<uint64_t>(values.raw_clock.tv_nsec);
  EXPECT_GE(raw, t0);
  EXPECT_LE(raw, t1);
  EXPECT_LT(values.raw_clock.tv_nsec, 1'000'000'000L);
  values.comp_mask = 1u << 5;  // not a value the device knows
  EXPECT_EQ(ibv_query_rt_values_ex(dev.ctx, &values), EINVAL);
}

class RcPairWallclock : public RcPair {
 protected:
  uint64_t wc_flags() const override {
    return uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};
  }
};

uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The wall-clock stamp is CLOCK_REALTIME at the completion: between the
// clock before the post and after the poll (a 100 ms margin for an NTP step).
TEST_F(RcPairWallclock, CompletionsCarryTheWallClock) {
  connect();
  const uint64_t before = realtime_ns();
  ibv_wr_start(ax);
  ax->wr_id = 9;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 16);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  ibv_poll_cq_attr attr{};
  const auto deadline = Clock::now() + kDeadline;
  int rc;
  while ((rc = ibv_start_poll(cq_a, &attr)) == ENOENT && Clock::now() < deadline) {
  }
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(cq_a->wr_id, 9u);
  const uint64_t wall = ibv_wc_read_completion_wallclock_ns(cq_a);
  ibv_end_poll(cq_a);
  const uint64_t after = realtime_ns();
  constexpr uint64_t kMargin = 100'000'000;
  EXPECT_GE(wall + kMargin, before);
  EXPECT_LE(wall, after + kMargin);
}

TEST_F(RcPair, CompletionsWithoutTheTimestampFlagCarryNone) {
  connect();
  ibv_wr_start(ax);
  ax->wr_id = 5;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(ax, mr_a->lkey, addr_a(0), 16);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  const auto [id, ts] = poll_timestamp(cq_a);
  EXPECT_EQ(id, 5u);
  EXPECT_EQ(ts, 0u);
}

TEST(UdPair, SendAndSendImmWithUdAddr) {
  Device dev;
  ASSERT_NE(dev.pd, nullptr);
  ibv_cq_ex* cq_a = create_cq_ex(dev.ctx);
  ibv_cq_ex* cq_b = create_cq_ex(dev.ctx);
  ASSERT_NE(cq_a, nullptr);
  ASSERT_NE(cq_b, nullptr);
  const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ibv_qp* a = create_qp_ex(dev.pd, cq_a, IBV_QPT_UD, ops);
  ibv_qp* b = create_qp_ex(dev.pd, cq_b, IBV_QPT_UD, ops);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  ASSERT_EQ(to_rts(a, 0, dev.gid), 0);
  ASSERT_EQ(to_rts(b, 0, dev.gid), 0);
  std::vector<uint8_t> sbuf(1024, 0), rbuf(4096, 0);
  for (size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<uint8_t>(i * 3);
  ibv_mr* smr = ibv_reg_mr(dev.pd, sbuf.data(), sbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* rmr = ibv_reg_mr(dev.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(smr, nullptr);
  ASSERT_NE(rmr, nullptr);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = dev.gid;
  ah_attr.grh.hop_limit = 64;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(dev.pd, &ah_attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);

  ASSERT_EQ(post_recv(b, 1, rbuf.data(), 1024 + kGrh, rmr->lkey), 0);
  ASSERT_EQ(post_recv(b, 2, rbuf.data() + 2048, 1024 + kGrh, rmr->lkey), 0);
  ibv_qp_ex* ax = ibv_qp_to_qp_ex(a);
  ASSERT_NE(ax, nullptr);
  ibv_wr_start(ax);
  ax->wr_id = 7;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_ud_addr(ax, ah, b->qp_num, kQkey);
  ibv_wr_set_sge(ax, smr->lkey, reinterpret_cast<uintptr_t>(sbuf.data()), 512);
  ax->wr_id = 8;
  ibv_wr_send_imm(ax, htonl(0x01020304));
  ibv_wr_set_ud_addr(ax, ah, b->qp_num, kQkey);
  ibv_wr_set_sge(ax, smr->lkey, reinterpret_cast<uintptr_t>(sbuf.data() + 512), 100);
  ASSERT_EQ(ibv_wr_complete(ax), 0);

  auto sent = poll_ex(cq_a, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].wr_id, 7u);
  EXPECT_EQ(sent[1].wr_id, 8u);
  for (const auto& c : sent) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.opcode, IBV_WC_SEND);
  }
  auto got = poll_ex(cq_b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, 512u + kGrh);
  EXPECT_EQ(got[0].src_qp, a->qp_num);
  EXPECT_TRUE(got[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].byte_len, 100u + kGrh);
  EXPECT_TRUE(got[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].imm_data, 0x01020304u);
  EXPECT_EQ(std::memcmp(rbuf.data() + kGrh, sbuf.data(), 512), 0);
  EXPECT_EQ(std::memcmp(rbuf.data() + 2048 + kGrh, sbuf.data() + 512, 100), 0);

  // Without wr_set_ud_addr a UD send has no destination.
  ibv_wr_start(ax);
  ibv_wr_send(ax);
  ibv_wr_set_sge(ax, smr->lkey, reinterpret_cast<uintptr_t>(sbuf.data()), 8);
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);
  // No RDMA on UD.
  ibv_wr_start(ax);
  ibv_wr_rdma_write(ax, rmr->rkey, reinterpret_cast<uintptr_t>(rbuf.data()));
  ibv_wr_set_sge(ax, smr->lkey, reinterpret_cast<uintptr_t>(sbuf.data()), 8);
  EXPECT_EQ(ibv_wr_complete(ax), EINVAL);

  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_dereg_mr(rmr), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_a)), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_b)), 0);
}

// A CQ made by the legacy ibv_create_cq answers the extended poll API too
// (every CQ is an ibv_cq_ex underneath; rdma-core providers make the same
// promise only for CQs from ibv_create_cq_ex, so this checks our layout).
TEST_F(RcPair, LegacyCqPollsThroughExtendedOps) {
  ibv_cq* legacy = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(legacy, nullptr);
  auto* lx = reinterpret_cast<ibv_cq_ex*>(legacy);
  ASSERT_NE(lx->start_poll, nullptr);
  ibv_qp_init_attr_ex attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = legacy;
  attr.recv_cq = legacy;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  attr.pd = dev.pd;
  attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
  ibv_qp* c = ibv_create_qp_ex(dev.ctx, &attr);
  ASSERT_NE(c, nullptr) << std::strerror(errno);
  ASSERT_EQ(to_rts(c, b->qp_num, dev.gid), 0);
  ASSERT_EQ(to_rts(b, c->qp_num, dev.gid), 0);
  ibv_qp_ex* cx = ibv_qp_to_qp_ex(c);
  ASSERT_NE(cx, nullptr);
  ibv_wr_start(cx);
  cx->wr_id = 99;
  cx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(cx, mr_b->rkey, addr_b(0));
  ibv_wr_set_sge(cx, mr_a->lkey, addr_a(0), 16);
  ASSERT_EQ(ibv_wr_complete(cx), 0);
  auto sent = poll_ex(lx, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 99u);
  EXPECT_EQ(sent[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[0].qp_num, c->qp_num);
  EXPECT_EQ(ibv_destroy_qp(c), 0);
  EXPECT_EQ(ibv_destroy_cq(legacy), 0);
}

}  // namespace
