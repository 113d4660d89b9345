// Unit tests of the QP state machine (engine/qp/qp_state.hpp).
//
// The expected transition table below is written out independently of the one
// in qp_state.cpp, from the Linux kernel's qp_state_table (core/verbs.c), so the
// matrix checks the implementation against the kernel rather than itself.
#include "engine/qp/qp_state.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using softhca::engine::apply_modify_qp;
using softhca::engine::check_modify_qp;
using softhca::engine::effective_modify_mask;
using softhca::engine::make_modify_context;
using softhca::engine::mark_sq_drained;
using softhca::engine::next_state;
using softhca::engine::qp_state_name;
using softhca::engine::qp_transition_rule;
using softhca::engine::query_qp_attributes;
using softhca::engine::QpAttributes;
using softhca::engine::QpModifyContext;

// Short names for the mask bits, to keep the expected table readable.
constexpr int kCur = IBV_QP_CUR_STATE;
constexpr int kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr int kAcc = IBV_QP_ACCESS_FLAGS;
constexpr int kPkey = IBV_QP_PKEY_INDEX;
constexpr int kPort = IBV_QP_PORT;
constexpr int kQkey = IBV_QP_QKEY;
constexpr int kAv = IBV_QP_AV;
constexpr int kMtu = IBV_QP_PATH_MTU;
constexpr int kTimeout = IBV_QP_TIMEOUT;
constexpr int kRetry = IBV_QP_RETRY_CNT;
constexpr int kRnrRetry = IBV_QP_RNR_RETRY;
constexpr int kRqPsn = IBV_QP_RQ_PSN;
constexpr int kMaxRd = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int kAlt = IBV_QP_ALT_PATH;
constexpr int kMinRnr = IBV_QP_MIN_RNR_TIMER;
constexpr int kSqPsn = IBV_QP_SQ_PSN;
constexpr int kMaxDestRd = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr int kMig = IBV_QP_PATH_MIG_STATE;
constexpr int kDestQpn = IBV_QP_DEST_QPN;

constexpr ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                    IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};

// One valid cell of the kernel's table, for RC, UC and UD.
struct ExpectedCell {
  ibv_qp_state from, to;
  int rc_req, rc_opt;
  int uc_req, uc_opt;
  int ud_req, ud_opt;
};

constexpr int kRcSendOpt = kCur | kAlt | kAcc | kMinRnr | kMig;
constexpr int kUcSendOpt = kCur | kAlt | kAcc | kMig;
constexpr int kUdSendOpt = kCur | kQkey;

const std::vector<ExpectedCell>& expected_cells() {
  static const std::vector<ExpectedCell> cells = {
      // from           to              RC req, RC opt        UC req, UC opt         UD req, UD opt
      {IBV_QPS_RESET, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_RESET, IBV_QPS_INIT, kPkey | kPort | kAcc, 0, kPkey | kPort | kAcc, 0,
       kPkey | kPort | kQkey, 0},
      {IBV_QPS_INIT, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_INIT, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_INIT, IBV_QPS_INIT, 0, kPkey | kPort | kAcc, 0, kPkey | kPort | kAcc, 0,
       kPkey | kPort | kQkey},
      {IBV_QPS_INIT, IBV_QPS_RTR, kAv | kMtu | kDestQpn | kRqPsn | kMaxDestRd | kMinRnr,
       kAlt | kAcc | kPkey, kAv | kMtu | kDestQpn | kRqPsn, kAlt | kAcc | kPkey, 0, kPkey | kQkey},
      {IBV_QPS_RTR, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_RTR, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_RTR, IBV_QPS_RTS, kTimeout | kRetry | kRnrRetry | kSqPsn | kMaxRd, kRcSendOpt,
       kSqPsn, kUcSendOpt, kSqPsn, kUdSendOpt},
      {IBV_QPS_RTS, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_RTS, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_RTS, IBV_QPS_RTS, 0, kRcSendOpt, 0, kUcSendOpt, 0, kUdSendOpt},
      {IBV_QPS_RTS, IBV_QPS_SQD, 0, kSqdNotify, 0, kSqdNotify, 0, kSqdNotify},
      {IBV_QPS_SQD, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_SQD, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_SQD, IBV_QPS_RTS, 0, kRcSendOpt, 0, kUcSendOpt, 0, kUdSendOpt},
      {IBV_QPS_SQD, IBV_QPS_SQD, 0,
       kPort | kAv | kTimeout | kRetry | kRnrRetry | kMaxRd | kMaxDestRd | kAlt | kAcc | kPkey |
           kMinRnr | kMig,
       0, kAv | kAlt | kAcc | kPkey | kMig, 0, kPkey | kQkey},
      {IBV_QPS_SQE, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_SQE, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_SQE, IBV_QPS_RTS, 0, 0, 0, kCur | kAcc, 0, kCur | kQkey},
      {IBV_QPS_ERR, IBV_QPS_RESET, 0, 0, 0, 0, 0, 0},
      {IBV_QPS_ERR, IBV_QPS_ERR, 0, 0, 0, 0, 0, 0},
  };
  return cells;
}

struct Expected {
  bool valid = false;
  int req = 0;
  int opt = 0;
};

Expected expected_rule(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to) {
  for (const ExpectedCell& c : expected_cells()) {
    if (c.from != from || c.to != to) continue;
    switch (type) {
      case IBV_QPT_RC: return {true, c.rc_req, c.rc_opt};
      case IBV_QPT_UC: return {true, c.uc_req, c.uc_opt};
      default: return {true, c.ud_req, c.ud_opt};
    }
  }
  return {};
}

// An attribute block whose every field is acceptable to a QP that is bound to
// port 1, so that any mask is judged by the table alone.
ibv_qp_attr good_attr(ibv_qp_state from, ibv_qp_state to) {
  ibv_qp_attr a{};
  a.qp_state = to;
  a.cur_qp_state = from;
  a.path_mtu = IBV_MTU_1024;
  a.path_mig_state = IBV_MIG_MIGRATED;
  a.qkey = 0x11111111;
  a.rq_psn = 0x123456;
  a.sq_psn = 0x654321;
  a.dest_qp_num = 0x42;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = 0xff;
  a.ah_attr.grh.dgid.raw[11] = 0xff;
  a.ah_attr.grh.dgid.raw[12] = 10;
  a.ah_attr.grh.dgid.raw[15] = 2;
  a.ah_attr.port_num = 1;
  a.alt_ah_attr = a.ah_attr;
  a.pkey_index = 0;
  a.alt_pkey_index = 0;
  a.en_sqd_async_notify = 1;
  a.max_rd_atomic = 4;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 12;
  a.port_num = 1;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.alt_port_num = 1;
  a.alt_timeout = 14;
  return a;
}

QpModifyContext context_for(ibv_qp_type type, ibv_qp_state current, bool ethernet = true) {
  QpModifyContext ctx;
  ctx.type = type;
  ctx.current = current;
  ctx.qp_port = current == IBV_QPS_RESET ? 0 : 1;
  ctx.ethernet_link = ethernet;
  return ctx;
}

std::string bit_name(int bit) {
  static const char* const names[] = {
      "STATE",   "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX",
      "PORT",    "QKEY",      "AV",                  "PATH_MTU",     "TIMEOUT",
      "RETRY_CNT", "RNR_RETRY", "RQ_PSN",            "MAX_QP_RD_ATOMIC", "ALT_PATH",
      "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN"};
  for (int i = 0; i < 21; ++i)
    if (bit == (1 << i)) return names[i];
  return "bit?";
}

bool ok(const softhca::Result<void>& r) { return r.has_value(); }
bool is_einval(const softhca::Result<void>& r) {
  return !r.has_value() && r.error() == std::errc::invalid_argument;
}

// ---------------------------------------------------------------------------
// The full matrix: every QP type x every (from, to) pair.

struct MatrixCase {
  ibv_qp_type type;
  ibv_qp_state from;
  ibv_qp_state to;
};

std::vector<MatrixCase> all_matrix_cases() {
  std::vector<MatrixCase> cases;
  for (ibv_qp_type t : kTypes)
    for (ibv_qp_state f : kStates)
      for (ibv_qp_state to : kStates) cases.push_back({t, f, to});
  return cases;
}

std::string type_name(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    default: return std::string("T").append(std::to_string(static_cast<int>(t)));
  }
}

class QpTransitionMatrix : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(QpTransitionMatrix, TableMatchesKernel) {
  const MatrixCase& c = GetParam();
  const Expected e = expected_rule(c.type, c.from, c.to);
  const auto rule = qp_transition_rule(c.type, c.from, c.to);
  EXPECT_EQ(rule.valid, e.valid);
  EXPECT_EQ(rule.required_mask, e.req);
  EXPECT_EQ(rule.optional_mask, e.opt);
}

TEST_P(QpTransitionMatrix, ModifyFollowsTable) {
  const MatrixCase& c = GetParam();
  const Expected e = expected_rule(c.type, c.from, c.to);
  const ibv_qp_attr attr = good_attr(c.from, c.to);

  for (bool ethernet : {true, false}) {
    SCOPED_TRACE(ethernet ? "RoCE link" : "InfiniBand link");
    const QpModifyContext ctx = context_for(c.type, c.from, ethernet);

    if (!e.valid) {
      // Invalid transitions fail whatever the mask.
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, IBV_QP_STATE)));
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, IBV_QP_STATE | kPkey | kPort | kAcc)));
      if (c.from == c.to) {
        // ...and so does a pure attribute change in that state (RTR, SQE).
        EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, 0)));
        EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, kAcc)));
      }
      continue;
    }

    const int base = IBV_QP_STATE | e.req;
    // Exactly the required mask succeeds.
    EXPECT_TRUE(ok(check_modify_qp(ctx, attr, base))) << "mask " << std::hex << base;
    // A self-transition may also be asked for without IBV_QP_STATE.
    if (c.from == c.to) {
      EXPECT_TRUE(ok(check_modify_qp(ctx, attr, e.req)));
    }

    // Every required bit is needed.
    for (int bit = 1; bit <= IBV_QP_DEST_QPN; bit <<= 1) {
      if (!(e.req & bit)) continue;
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, base & ~bit)))
          << "without required " << bit_name(bit);
    }
    // Every optional bit is allowed (alternate paths only on InfiniBand).
    for (int bit = 1; bit <= IBV_QP_DEST_QPN; bit <<= 1) {
      if (!(e.opt & bit)) continue;
      const auto r = check_modify_qp(ctx, attr, base | bit);
      if (bit == kAlt && ethernet) {
        EXPECT_TRUE(is_einval(r)) << "ALT_PATH on RoCE";
      } else {
        EXPECT_TRUE(ok(r)) << "with optional " << bit_name(bit);
      }
    }
    // All optional bits together.
    if (!ethernet) {
      EXPECT_TRUE(ok(check_modify_qp(ctx, attr, base | e.opt)));
    }
    // Every bit outside required | optional | STATE is refused.
    for (int bit = 1; bit <= IBV_QP_DEST_QPN; bit <<= 1) {
      if ((e.req | e.opt | IBV_QP_STATE) & bit) continue;
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, attr, base | bit)))
          << "with disallowed " << bit_name(bit);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllPairs, QpTransitionMatrix,
                         ::testing::ValuesIn(all_matrix_cases()),
                         [](const ::testing::TestParamInfo<MatrixCase>& info) {
                           return type_name(info.param.type) + "_" +
                                  qp_state_name(info.param.from) + "_to_" +
                                  qp_state_name(info.param.to);
                         });

// ---------------------------------------------------------------------------
// Value range checks, one transition each.

// RESET->INIT for RC with the required mask.
constexpr int kRcInitMask = IBV_QP_STATE | kPkey | kPort | kAcc;
constexpr int kRcRtrMask = IBV_QP_STATE | kAv | kMtu | kDestQpn | kRqPsn | kMaxDestRd | kMinRnr;
constexpr int kRcRtsMask = IBV_QP_STATE | kTimeout | kRetry | kRnrRetry | kSqPsn | kMaxRd;

TEST(QpModifyValues, PortMustExist) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RESET);
  auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcInitMask)));
  a.port_num = 0;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcInitMask)));
  a.port_num = 2;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcInitMask)));
}

TEST(QpModifyValues, PkeyIndexInsideTable) {
  const auto ctx = context_for(IBV_QPT_UD, IBV_QPS_RESET);
  auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  const int mask = IBV_QP_STATE | kPkey | kPort | kQkey;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, mask)));
  a.pkey_index = softhca::limits::kMaxPkeys;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, mask)));
}

TEST(QpModifyValues, PrivilegedQkey) {
  auto ctx = context_for(IBV_QPT_UD, IBV_QPS_RESET);
  auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  const int mask = IBV_QP_STATE | kPkey | kPort | kQkey;
  a.qkey = 0x80010000;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, mask)));
  ctx.privileged_qkey_allowed = false;
  const auto r = check_modify_qp(ctx, a, mask);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), std::errc::operation_not_permitted);
  a.qkey = 0x7FFFFFFF;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, mask)));
}

TEST(QpModifyValues, AccessFlags) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RESET);
  auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  a.qp_access_flags = 0;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcInitMask)));
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND |
                      IBV_ACCESS_RELAXED_ORDERING;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcInitMask)));
  a.qp_access_flags = 1U << 8;  // no name in rdma-core 44
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcInitMask)));
  a.qp_access_flags = 1U << 31;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcInitMask)));
}

TEST(QpModifyValues, PathMtu) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  for (ibv_mtu m : {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096}) {
    a.path_mtu = m;
    EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask))) << m;
  }
  for (int bad : {0, 6, 7}) {
    std::memcpy(&a.path_mtu, &bad, sizeof bad);
    EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask))) << bad;
  }
  auto small = ctx;
  small.max_path_mtu = IBV_MTU_1024;
  a.path_mtu = IBV_MTU_2048;
  EXPECT_TRUE(is_einval(check_modify_qp(small, a, kRcRtrMask)));
}

TEST(QpModifyValues, RdAtomicDepths) {
  {
    const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
    auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
    a.max_dest_rd_atomic = softhca::limits::kMaxQpRdAtom;
    EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
    a.max_dest_rd_atomic = softhca::limits::kMaxQpRdAtom + 1;
    EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
    a.max_dest_rd_atomic = 0;
    EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  }
  {
    const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTR);
    auto a = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
    a.max_rd_atomic = softhca::limits::kMaxQpInitRdAtom;
    EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtsMask)));
    a.max_rd_atomic = softhca::limits::kMaxQpInitRdAtom + 1;
    EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtsMask)));
  }
}

TEST(QpModifyValues, TimersAndCounters) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTR);
  const int mask = kRcRtsMask | kMinRnr;
  auto a = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  a.timeout = 31;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.min_rnr_timer = 31;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, mask)));
  a.timeout = 0;
  a.retry_cnt = 0;
  a.rnr_retry = 0;
  a.min_rnr_timer = 0;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, mask)));

  auto b = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  b.timeout = 32;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, mask)));
  b = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  b.retry_cnt = 8;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, mask)));
  b = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  b.rnr_retry = 8;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, mask)));
  b = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  b.min_rnr_timer = 32;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, mask)));
}

TEST(QpModifyValues, DestQpnIs24Bits) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.dest_qp_num = 0xFFFFFF;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  a.dest_qp_num = 0x1000000;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
}

TEST(QpModifyValues, PsnsAreMaskedNotRefused) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.rq_psn = 0xFF123456;
  ASSERT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  QpAttributes attrs;
  attrs.state = IBV_QPS_INIT;
  attrs.port_num = 1;
  apply_modify_qp(attrs, a, kRcRtrMask);
  EXPECT_EQ(attrs.rq_psn, 0x123456U);
}

// The kernel takes any 32-bit flow label (UCX's rc_verbs passes 0xFFFFFFFF)
// and mlx5 keeps its 20 bits: so does softhca, and query reports those.
TEST(QpModifyValues, FlowLabelIsMaskedNotRefused) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.ah_attr.grh.flow_label = 0xFFFFFFFF;
  ASSERT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  QpAttributes attrs;
  attrs.state = IBV_QPS_INIT;
  attrs.port_num = 1;
  apply_modify_qp(attrs, a, kRcRtrMask);
  EXPECT_EQ(attrs.ah.flow_label, 0xFFFFFU);
  a.ah_attr.grh.flow_label = 0x12345678;
  apply_modify_qp(attrs, a, kRcRtrMask);
  ibv_qp_attr q{};
  query_qp_attributes(attrs, q);
  EXPECT_EQ(q.ah_attr.grh.flow_label, 0x45678U);
}

TEST(QpModifyValues, RoceAddressVectorNeedsGrh) {
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.ah_attr.is_global = 0;
  a.ah_attr.dlid = 7;
  EXPECT_TRUE(is_einval(check_modify_qp(context_for(IBV_QPT_RC, IBV_QPS_INIT, true), a, kRcRtrMask)));
  EXPECT_TRUE(ok(check_modify_qp(context_for(IBV_QPT_RC, IBV_QPS_INIT, false), a, kRcRtrMask)));
  EXPECT_TRUE(is_einval(check_modify_qp(context_for(IBV_QPT_UC, IBV_QPS_INIT, true), a,
                                        IBV_QP_STATE | kAv | kMtu | kDestQpn | kRqPsn)));
}

TEST(QpModifyValues, SgidIndex) {
  auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.ah_attr.grh.sgid_index = softhca::limits::kGidTableLen - 1;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  a.ah_attr.grh.sgid_index = softhca::limits::kGidTableLen;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
  ctx.gid_table_len = 4;
  a.ah_attr.grh.sgid_index = 4;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
  // Inside the table but empty: the core says ENODATA.
  ctx.populated_gids = 0b0011;
  a.ah_attr.grh.sgid_index = 2;
  const auto r = check_modify_qp(ctx, a, kRcRtrMask);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), std::errc::no_message_available);
  a.ah_attr.grh.sgid_index = 1;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
}

TEST(QpModifyValues, AddressVectorPort) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.ah_attr.port_num = 0;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
  a.ah_attr.port_num = 2;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtrMask)));
  // INIT->RTR: the AV's port must be the port bound at RESET->INIT.
  auto two_ports = ctx;
  two_ports.port_count = 2;
  two_ports.qp_port = 1;
  a.ah_attr.port_num = 2;
  EXPECT_TRUE(is_einval(check_modify_qp(two_ports, a, kRcRtrMask)));
  // SQD->SQD moving port and AV: both must agree.
  auto sqd = context_for(IBV_QPT_RC, IBV_QPS_SQD);
  sqd.port_count = 2;
  auto b = good_attr(IBV_QPS_SQD, IBV_QPS_SQD);
  b.port_num = 2;
  b.ah_attr.port_num = 2;
  EXPECT_TRUE(ok(check_modify_qp(sqd, b, kAv | kPort)));
  b.ah_attr.port_num = 1;
  EXPECT_TRUE(is_einval(check_modify_qp(sqd, b, kAv | kPort)));
}

TEST(QpModifyValues, AddressVectorFieldWidths) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.ah_attr.sl = 15;
  a.ah_attr.grh.flow_label = 0xFFFFF;
  a.ah_attr.static_rate = IBV_RATE_100_GBPS;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtrMask)));
  auto b = a;
  b.ah_attr.sl = 16;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, kRcRtrMask)));
  b = a;
  b.ah_attr.static_rate = IBV_RATE_1200_GBPS + 1;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, kRcRtrMask)));
}

TEST(QpModifyValues, AlternatePath) {
  const auto ib = context_for(IBV_QPT_RC, IBV_QPS_RTS, false);
  auto a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  EXPECT_TRUE(ok(check_modify_qp(ib, a, kAlt)));
  // On RoCE the core bans alternate paths.
  EXPECT_TRUE(is_einval(check_modify_qp(context_for(IBV_QPT_RC, IBV_QPS_RTS, true), a, kAlt)));
  auto b = a;
  b.alt_port_num = 0;
  EXPECT_TRUE(is_einval(check_modify_qp(ib, b, kAlt)));
  b = a;
  b.alt_timeout = 32;
  EXPECT_TRUE(is_einval(check_modify_qp(ib, b, kAlt)));
  b = a;
  b.alt_pkey_index = 1;
  EXPECT_TRUE(is_einval(check_modify_qp(ib, b, kAlt)));
}

TEST(QpModifyValues, PathMigState) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTS);
  auto a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  a.path_mig_state = IBV_MIG_ARMED;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kMig)));
  const int bad = 3;
  std::memcpy(&a.path_mig_state, &bad, sizeof bad);
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kMig)));
}

TEST(QpModifyValues, StateValuesMustBeStates) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTS);
  auto a = good_attr(IBV_QPS_RTS, IBV_QPS_ERR);
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, IBV_QP_STATE)));
  a.qp_state = IBV_QPS_UNKNOWN;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, IBV_QP_STATE)));
  const int garbage = 1000;
  std::memcpy(&a.qp_state, &garbage, sizeof garbage);
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, IBV_QP_STATE)));
  auto b = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  b.cur_qp_state = IBV_QPS_UNKNOWN;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, IBV_QP_STATE | kCur)));
}

TEST(QpModifyValues, CurStateMustMatch) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTR);
  auto a = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, kRcRtsMask | kCur)));
  a.cur_qp_state = IBV_QPS_RTS;  // the QP is in RTR
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, kRcRtsMask | kCur)));
  // Never allowed from RESET/INIT, even when it names the right state.
  const auto init = context_for(IBV_QPT_RC, IBV_QPS_INIT);
  auto b = good_attr(IBV_QPS_INIT, IBV_QPS_INIT);
  EXPECT_TRUE(is_einval(check_modify_qp(init, b, IBV_QP_STATE | kCur)));
  // SQE->RTS for UD is the transition CUR_STATE exists for.
  const auto sqe = context_for(IBV_QPT_UD, IBV_QPS_SQE);
  auto c = good_attr(IBV_QPS_SQE, IBV_QPS_RTS);
  EXPECT_TRUE(ok(check_modify_qp(sqe, c, IBV_QP_STATE | kCur)));
}

TEST(QpModifyValues, CapIsNeverModifiable) {
  for (ibv_qp_type t : kTypes) {
    for (ibv_qp_state s : kStates) {
      const auto ctx = context_for(t, s);
      const auto a = good_attr(s, s);
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, IBV_QP_CAP)));
      EXPECT_TRUE(is_einval(check_modify_qp(ctx, a, IBV_QP_STATE | IBV_QP_CAP)));
    }
  }
}

TEST(QpModifyValues, MaskBitsBeyondDestQpnAreUnsupported) {
  const auto ctx = context_for(IBV_QPT_RC, IBV_QPS_RTS);
  const auto a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  for (int mask : {static_cast<int>(IBV_QP_RATE_LIMIT), 1 << 21, 1 << 24, 1 << 30,
                   static_cast<int>(1U << 31)}) {
    const auto r = check_modify_qp(ctx, a, mask);
    ASSERT_FALSE(r.has_value()) << mask;
    EXPECT_EQ(r.error(), std::errc::operation_not_supported) << mask;
  }
}

TEST(QpModifyValues, SqdWhileDraining) {
  auto ctx = context_for(IBV_QPT_RC, IBV_QPS_SQD);
  ctx.sq_draining = true;
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, good_attr(IBV_QPS_SQD, IBV_QPS_RTS), IBV_QP_STATE)));
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, good_attr(IBV_QPS_SQD, IBV_QPS_SQD), kTimeout)));
  EXPECT_TRUE(ok(check_modify_qp(ctx, good_attr(IBV_QPS_SQD, IBV_QPS_ERR), IBV_QP_STATE)));
  EXPECT_TRUE(ok(check_modify_qp(ctx, good_attr(IBV_QPS_SQD, IBV_QPS_RESET), IBV_QP_STATE)));
  ctx.sq_draining = false;
  EXPECT_TRUE(ok(check_modify_qp(ctx, good_attr(IBV_QPS_SQD, IBV_QPS_RTS), IBV_QP_STATE)));
}

TEST(QpModifyValues, UnsupportedQpType) {
  const auto ctx = context_for(IBV_QPT_DRIVER, IBV_QPS_RESET);
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, good_attr(IBV_QPS_RESET, IBV_QPS_RESET), 0)));
  EXPECT_FALSE(qp_transition_rule(IBV_QPT_DRIVER, IBV_QPS_RESET, IBV_QPS_INIT).valid);
}

// UD differs from what the RDMA Aware Networks manual lists: no access flags at
// RESET->INIT, no path MTU at INIT->RTR, and an SQ PSN at RTR->RTS (kernel table).
TEST(QpModifyValues, UdFollowsKernelNotManual) {
  const auto reset = context_for(IBV_QPT_UD, IBV_QPS_RESET);
  auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  EXPECT_TRUE(is_einval(check_modify_qp(reset, a, IBV_QP_STATE | kPkey | kPort | kQkey | kAcc)));
  const auto init = context_for(IBV_QPT_UD, IBV_QPS_INIT);
  EXPECT_TRUE(ok(check_modify_qp(init, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), IBV_QP_STATE)));
  EXPECT_TRUE(is_einval(
      check_modify_qp(init, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), IBV_QP_STATE | kMtu)));
  const auto rtr = context_for(IBV_QPT_UD, IBV_QPS_RTR);
  EXPECT_TRUE(is_einval(check_modify_qp(rtr, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), IBV_QP_STATE)));
}

// ---------------------------------------------------------------------------
// Other QP types: the kernel's columns for XRC and RAW_PACKET.

TEST(QpOtherTypes, XrcIgnoredAttributesAreDropped) {
  EXPECT_EQ(effective_modify_mask(IBV_QPT_XRC_SEND, kMaxDestRd | kMinRnr | kAv), kAv);
  EXPECT_EQ(effective_modify_mask(IBV_QPT_XRC_RECV, kMaxRd | kRetry | kRnrRetry | kTimeout),
            kTimeout);
  EXPECT_EQ(effective_modify_mask(IBV_QPT_RC, kMaxRd | kRetry), kMaxRd | kRetry);

  // XRC_SEND INIT->RTR: like UC's; a responder depth is ignored, not refused.
  auto ctx = context_for(IBV_QPT_XRC_SEND, IBV_QPS_INIT);
  const auto a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  const int uc_rtr = IBV_QP_STATE | kAv | kMtu | kDestQpn | kRqPsn;
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, uc_rtr)));
  EXPECT_TRUE(ok(check_modify_qp(ctx, a, uc_rtr | kMaxDestRd | kMinRnr)));
  QpAttributes attrs;
  attrs.state = IBV_QPS_INIT;
  attrs.port_num = 1;
  apply_modify_qp(attrs, a, uc_rtr | kMaxDestRd | kMinRnr, IBV_QPT_XRC_SEND);
  EXPECT_EQ(attrs.state, IBV_QPS_RTR);
  EXPECT_EQ(attrs.max_dest_rd_atomic, 0);
  EXPECT_EQ(attrs.min_rnr_timer, 0);

  // XRC_RECV RTR->RTS needs only TIMEOUT and SQ_PSN.
  ctx = context_for(IBV_QPT_XRC_RECV, IBV_QPS_RTR);
  const auto b = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  EXPECT_TRUE(ok(check_modify_qp(ctx, b, IBV_QP_STATE | kTimeout | kSqPsn)));
  EXPECT_TRUE(ok(check_modify_qp(ctx, b, IBV_QP_STATE | kTimeout | kSqPsn | kRetry | kMaxRd)));
  EXPECT_TRUE(is_einval(check_modify_qp(ctx, b, IBV_QP_STATE | kSqPsn)));
}

TEST(QpOtherTypes, RawPacket) {
  const auto reset = context_for(IBV_QPT_RAW_PACKET, IBV_QPS_RESET);
  const auto a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  EXPECT_TRUE(ok(check_modify_qp(reset, a, IBV_QP_STATE | kPort)));
  EXPECT_TRUE(is_einval(check_modify_qp(reset, a, IBV_QP_STATE)));
  EXPECT_TRUE(is_einval(check_modify_qp(reset, a, IBV_QP_STATE | kPort | kPkey)));
  const auto init = context_for(IBV_QPT_RAW_PACKET, IBV_QPS_INIT);
  EXPECT_TRUE(ok(check_modify_qp(init, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), IBV_QP_STATE)));
  const auto rtr = context_for(IBV_QPT_RAW_PACKET, IBV_QPS_RTR);
  EXPECT_TRUE(ok(check_modify_qp(rtr, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), IBV_QP_STATE)));
  // The table allows a rate limit, but the legacy modify path cannot carry it.
  const auto r =
      check_modify_qp(rtr, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), IBV_QP_STATE | IBV_QP_RATE_LIMIT);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), std::errc::operation_not_supported);
  EXPECT_EQ(qp_transition_rule(IBV_QPT_RAW_PACKET, IBV_QPS_RTR, IBV_QPS_RTS).optional_mask,
            IBV_QP_RATE_LIMIT);
}

// ---------------------------------------------------------------------------
// Names, next_state, apply and query.

TEST(QpStateNames, AllStates) {
  EXPECT_STREQ(qp_state_name(IBV_QPS_RESET), "RESET");
  EXPECT_STREQ(qp_state_name(IBV_QPS_INIT), "INIT");
  EXPECT_STREQ(qp_state_name(IBV_QPS_RTR), "RTR");
  EXPECT_STREQ(qp_state_name(IBV_QPS_RTS), "RTS");
  EXPECT_STREQ(qp_state_name(IBV_QPS_SQD), "SQD");
  EXPECT_STREQ(qp_state_name(IBV_QPS_SQE), "SQE");
  EXPECT_STREQ(qp_state_name(IBV_QPS_ERR), "ERR");
  EXPECT_STREQ(qp_state_name(IBV_QPS_UNKNOWN), "UNKNOWN");
}

TEST(QpNextState, StateBitSelects) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(next_state(IBV_QPS_RTS, a, IBV_QP_STATE), IBV_QPS_ERR);
  EXPECT_EQ(next_state(IBV_QPS_RTS, a, IBV_QP_QKEY), IBV_QPS_RTS);
}

// Runs check then apply, as the engine does; fails the test if check refuses.
void modify(QpAttributes& attrs, ibv_qp_type type, const ibv_qp_attr& a, int mask) {
  const auto ctx = make_modify_context(type, attrs);
  const auto r = check_modify_qp(ctx, a, mask);
  ASSERT_TRUE(r.has_value()) << qp_state_name(attrs.state) << " mask " << std::hex << mask;
  apply_modify_qp(attrs, a, mask, type);
}

TEST(QpApply, RcBringUpQueryAndReset) {
  QpAttributes attrs;
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RESET, IBV_QPS_INIT), kRcInitMask);
  EXPECT_EQ(attrs.state, IBV_QPS_INIT);
  EXPECT_EQ(attrs.port_num, 1);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), kRcRtrMask);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), kRcRtsMask);
  EXPECT_EQ(attrs.state, IBV_QPS_RTS);

  ibv_qp_attr q{};
  q.cap.max_send_wr = 77;  // owned by the caller: left alone
  query_qp_attributes(attrs, q);
  const ibv_qp_attr g = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  EXPECT_EQ(q.cap.max_send_wr, 77U);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.cur_qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.path_mtu, g.path_mtu);
  EXPECT_EQ(q.rq_psn, g.rq_psn);
  EXPECT_EQ(q.sq_psn, g.sq_psn);
  EXPECT_EQ(q.dest_qp_num, g.dest_qp_num);
  EXPECT_EQ(q.qp_access_flags, g.qp_access_flags);
  EXPECT_EQ(q.pkey_index, 0);
  EXPECT_EQ(q.port_num, 1);
  EXPECT_EQ(q.max_rd_atomic, g.max_rd_atomic);
  EXPECT_EQ(q.max_dest_rd_atomic, g.max_dest_rd_atomic);
  EXPECT_EQ(q.min_rnr_timer, g.min_rnr_timer);
  EXPECT_EQ(q.timeout, g.timeout);
  EXPECT_EQ(q.retry_cnt, g.retry_cnt);
  EXPECT_EQ(q.rnr_retry, g.rnr_retry);
  EXPECT_EQ(q.ah_attr.is_global, 1);
  EXPECT_EQ(q.ah_attr.port_num, 1);
  EXPECT_EQ(q.ah_attr.grh.sgid_index, g.ah_attr.grh.sgid_index);
  EXPECT_EQ(q.ah_attr.grh.hop_limit, g.ah_attr.grh.hop_limit);
  EXPECT_EQ(0, std::memcmp(q.ah_attr.grh.dgid.raw, g.ah_attr.grh.dgid.raw, 16));
  EXPECT_EQ(q.alt_port_num, 0);
  EXPECT_EQ(q.sq_draining, 0);

  // RTS->RTS attribute change without IBV_QP_STATE.
  auto change = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  change.min_rnr_timer = 3;
  modify(attrs, IBV_QPT_RC, change, kMinRnr);
  EXPECT_EQ(attrs.min_rnr_timer, 3);
  EXPECT_EQ(attrs.state, IBV_QPS_RTS);

  // To ERR keeps the attributes; to RESET forgets them.
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RTS, IBV_QPS_ERR), IBV_QP_STATE);
  EXPECT_EQ(attrs.state, IBV_QPS_ERR);
  EXPECT_EQ(attrs.dest_qpn, g.dest_qp_num);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_ERR, IBV_QPS_RESET), IBV_QP_STATE);
  EXPECT_EQ(attrs, QpAttributes{});
  query_qp_attributes(attrs, q);
  EXPECT_EQ(q.qp_state, IBV_QPS_RESET);
  EXPECT_EQ(q.dest_qp_num, 0U);
  EXPECT_EQ(q.port_num, 0);
}

TEST(QpApply, UdBringUp) {
  QpAttributes attrs;
  modify(attrs, IBV_QPT_UD, good_attr(IBV_QPS_RESET, IBV_QPS_INIT),
         IBV_QP_STATE | kPkey | kPort | kQkey);
  EXPECT_EQ(attrs.qkey, 0x11111111U);
  modify(attrs, IBV_QPT_UD, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), IBV_QP_STATE);
  modify(attrs, IBV_QPT_UD, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), IBV_QP_STATE | kSqPsn);
  EXPECT_EQ(attrs.state, IBV_QPS_RTS);
  EXPECT_EQ(attrs.sq_psn, 0x654321U);
  EXPECT_FALSE(attrs.ah.is_global);  // UD QPs have no AV of their own
}

TEST(QpApply, SqdDrainAndResume) {
  QpAttributes attrs;
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RESET, IBV_QPS_INIT), kRcInitMask);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_INIT, IBV_QPS_RTR), kRcRtrMask);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RTR, IBV_QPS_RTS), kRcRtsMask);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_RTS, IBV_QPS_SQD), IBV_QP_STATE | kSqdNotify);
  EXPECT_EQ(attrs.state, IBV_QPS_SQD);
  EXPECT_TRUE(attrs.sq_draining);
  EXPECT_TRUE(attrs.en_sqd_async_notify);
  ibv_qp_attr q{};
  query_qp_attributes(attrs, q);
  EXPECT_EQ(q.sq_draining, 1);
  EXPECT_EQ(q.en_sqd_async_notify, 1);

  // While draining, only teardown is allowed.
  EXPECT_TRUE(is_einval(check_modify_qp(make_modify_context(IBV_QPT_RC, attrs),
                                        good_attr(IBV_QPS_SQD, IBV_QPS_RTS), IBV_QP_STATE)));
  mark_sq_drained(attrs);
  // Drained: SQD->SQD may change the timeout, then resume.
  auto change = good_attr(IBV_QPS_SQD, IBV_QPS_SQD);
  change.timeout = 20;
  modify(attrs, IBV_QPT_RC, change, kTimeout);
  EXPECT_EQ(attrs.timeout, 20);
  EXPECT_FALSE(attrs.sq_draining);
  modify(attrs, IBV_QPT_RC, good_attr(IBV_QPS_SQD, IBV_QPS_RTS), IBV_QP_STATE);
  EXPECT_EQ(attrs.state, IBV_QPS_RTS);
  EXPECT_FALSE(attrs.sq_draining);
  EXPECT_FALSE(attrs.en_sqd_async_notify);
}

TEST(QpApply, MakeModifyContext) {
  QpAttributes attrs;
  attrs.state = IBV_QPS_SQD;
  attrs.port_num = 1;
  attrs.sq_draining = true;
  const auto ctx = make_modify_context(IBV_QPT_UC, attrs);
  EXPECT_EQ(ctx.type, IBV_QPT_UC);
  EXPECT_EQ(ctx.current, IBV_QPS_SQD);
  EXPECT_EQ(ctx.qp_port, 1);
  EXPECT_TRUE(ctx.sq_draining);
  EXPECT_TRUE(ctx.ethernet_link);
  EXPECT_EQ(ctx.pkey_table_len, softhca::limits::kMaxPkeys);
  EXPECT_EQ(ctx.gid_table_len, softhca::limits::kGidTableLen);
}

}  // namespace
