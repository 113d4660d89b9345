// QP state machine: transition table, modify validation, attribute bookkeeping.
// Facts come from the Linux kernel (core/verbs.c, core/uverbs_cmd.c, core/cache.c,
// sw/rxe/rxe_qp.c) and rdma-core 44 (libibverbs/cmd.c); the code is our own.
#include "engine/qp/qp_state.hpp"

#include <cstring>

#include "wire/ud_grh.hpp"

namespace softhca::engine {
namespace {

// Column of the per-type masks inside one table cell.
enum TypeColumn : int { kColRc, kColUc, kColUd, kColRaw, kColXrcSend, kColXrcRecv, kNumColumns };

int column_of(ibv_qp_type type) {
  switch (type) {
    case IBV_QPT_RC: return kColRc;
    case IBV_QPT_UC: return kColUc;
    case IBV_QPT_UD: return kColUd;
    case IBV_QPT_RAW_PACKET: return kColRaw;
    case IBV_QPT_XRC_SEND: return kColXrcSend;
    case IBV_QPT_XRC_RECV: return kColXrcRecv;
    default: return -1;
  }
}

using PerType = std::array<int, kNumColumns>;

struct Cell {
  bool valid = false;
  PerType required{};
  PerType optional{};
};

using Table = std::array<std::array<Cell, kNumQpStates>, kNumQpStates>;

// Masks listed in column order: RC, UC, UD, RAW_PACKET, XRC_SEND, XRC_RECV.
constexpr PerType by_type(int rc, int uc, int ud, int raw, int xrc_send, int xrc_recv) {
  return PerType{rc, uc, ud, raw, xrc_send, xrc_recv};
}

constexpr PerType same_for_all_but_raw(int mask) { return by_type(mask, mask, mask, 0, mask, mask); }

constexpr Table build_table() {
  Table t{};
  // A transition with no attributes at all: every type, nothing required or allowed.
  auto bare = [&t](ibv_qp_state from, ibv_qp_state to) { t[from][to].valid = true; };

  // RESET and ERR can be entered from every state, and RESET->RESET, ERR->ERR are no-ops.
  for (int s = IBV_QPS_RESET; s <= IBV_QPS_ERR; ++s) {
    bare(static_cast<ibv_qp_state>(s), IBV_QPS_RESET);
    if (s != IBV_QPS_RESET) bare(static_cast<ibv_qp_state>(s), IBV_QPS_ERR);
  }

  // Connected types bind pkey/port/access; UD binds pkey/port/qkey; RAW only a port.
  constexpr int kConnInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  constexpr int kUdInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  {
    Cell& c = t[IBV_QPS_RESET][IBV_QPS_INIT];
    c.valid = true;
    c.required = by_type(kConnInit, kConnInit, kUdInit, IBV_QP_PORT, kConnInit, kConnInit);
  }
  {
    // INIT->INIT may re-set what RESET->INIT set (RAW: nothing).
    Cell& c = t[IBV_QPS_INIT][IBV_QPS_INIT];
    c.valid = true;
    c.optional = by_type(kConnInit, kConnInit, kUdInit, 0, kConnInit, kConnInit);
  }
  {
    // INIT->RTR: connected QPs learn the remote side; responders (RC, XRC_RECV)
    // also their read/atomic depth and RNR timer. UD/RAW need nothing.
    constexpr int kRemote = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    constexpr int kResponder = kRemote | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    constexpr int kConnOpt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    Cell& c = t[IBV_QPS_INIT][IBV_QPS_RTR];
    c.valid = true;
    c.required = by_type(kResponder, kRemote, 0, 0, kRemote, kResponder);
    c.optional = by_type(kConnOpt, kConnOpt, IBV_QP_PKEY_INDEX | IBV_QP_QKEY, 0, kConnOpt, kConnOpt);
  }

  // Attributes a QP that is (or goes back to) sending may change.
  constexpr int kUcSend = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                          IBV_QP_PATH_MIG_STATE;
  constexpr int kRcSend = kUcSend | IBV_QP_MIN_RNR_TIMER;
  constexpr int kUdSend = IBV_QP_CUR_STATE | IBV_QP_QKEY;
  {
    // RTR->RTS: every type sets its send PSN; RC-like requesters also timers and
    // read depth; XRC_RECV only the timeout. RAW may set a rate limit.
    constexpr int kRequester = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    Cell& c = t[IBV_QPS_RTR][IBV_QPS_RTS];
    c.valid = true;
    c.required = by_type(kRequester, IBV_QP_SQ_PSN, IBV_QP_SQ_PSN, 0, kRequester,
                         IBV_QP_TIMEOUT | IBV_QP_SQ_PSN);
    c.optional = by_type(kRcSend, kUcSend, kUdSend, IBV_QP_RATE_LIMIT, kUcSend, kRcSend);
  }
  {
    Cell& c = t[IBV_QPS_RTS][IBV_QPS_RTS];
    c.valid = true;
    c.optional = by_type(kRcSend, kUcSend, kUdSend, IBV_QP_RATE_LIMIT, kUcSend, kRcSend);
  }
  {
    // RTS->SQD: only the "tell me when drained" flag.
    Cell& c = t[IBV_QPS_RTS][IBV_QPS_SQD];
    c.valid = true;
    c.optional = same_for_all_but_raw(IBV_QP_EN_SQD_ASYNC_NOTIFY);
  }
  {
    Cell& c = t[IBV_QPS_SQD][IBV_QPS_RTS];
    c.valid = true;
    c.optional = by_type(kRcSend, kUcSend, kUdSend, 0, kUcSend, kRcSend);
  }
  {
    // SQD->SQD: a drained QP may change its path and most connection parameters.
    constexpr int kPath = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                          IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE;
    constexpr int kRc = kPath | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    constexpr int kXrcSend = kRc & ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    constexpr int kXrcRecv = kRc & ~(IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    Cell& c = t[IBV_QPS_SQD][IBV_QPS_SQD];
    c.valid = true;
    c.optional = by_type(kRc, kPath, IBV_QP_PKEY_INDEX | IBV_QP_QKEY, 0, kXrcSend, kXrcRecv);
  }
  {
    // SQE (entered only by the device, on a UD/UC send error) back to RTS.
    Cell& c = t[IBV_QPS_SQE][IBV_QPS_RTS];
    c.valid = true;
    c.optional = by_type(0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS, kUdSend, 0, 0, 0);
  }
  return t;
}

constexpr Table kTable = build_table();

bool is_state(int s) { return s >= IBV_QPS_RESET && s <= IBV_QPS_ERR; }

// Reads an enum field of a caller's struct as a plain int: a C caller may store
// any int there, and loading an out-of-range value as the enum type is what
// -fsanitize=enum traps on.
template <typename E>
int raw(const E& field) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

std::unexpected<std::errc> invalid() { return fail(std::errc::invalid_argument); }

bool port_valid(const QpModifyContext& ctx, unsigned port) {
  return port >= 1 && port <= ctx.port_count;
}

// The checks the core makes on an address vector (rdma_check_ah_attr and
// rdma_get_gid_attr), plus softhca's field-width checks.
Result<void> check_ah(const QpModifyContext& ctx, const ibv_ah_attr& ah) {
  // An AV names a port of this device (uverbs/core: EINVAL).
  if (!port_valid(ctx, ah.port_num)) return invalid();
  // RoCE routes on GIDs: an AV without a GRH cannot be resolved (core: EINVAL).
  if (ctx.ethernet_link && !ah.is_global) return invalid();
  if (ah.is_global) {
    // The source GID index must lie inside the GID table (core: EINVAL).
    if (ah.grh.sgid_index >= ctx.gid_table_len) return invalid();
    // An index inside the table whose entry is empty (core, since 5.10: ENODATA).
    if (ah.grh.sgid_index < 64 && !((ctx.populated_gids >> ah.grh.sgid_index) & 1U))
      return fail(std::errc::no_message_available);
    // No check of the flow label: it is a 20-bit field, and the kernel takes
    // any 32-bit value (UCX's rc_verbs passes 0xFFFFFFFF). apply_modify_qp
    // keeps the low 20 bits, as mlx5 does.
  }
  // The service level is a 4-bit field (softhca: the kernel would truncate).
  if (ah.sl > 15) return invalid();
  // static_rate must be an enum ibv_rate value (softhca; hardware drivers reject unknown rates).
  if (ah.static_rate > IBV_RATE_1200_GBPS) return invalid();
  return {};
}

}  // namespace

bool is_supported_qp_type(ibv_qp_type type) { return column_of(type) >= 0; }

QpTransitionRule qp_transition_rule(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to) {
  const int col = column_of(type);
  if (col < 0 || !is_state(from) || !is_state(to)) return {};
  const Cell& c = kTable[from][to];
  if (!c.valid) return {};
  return QpTransitionRule{c.required[col], c.optional[col], true};
}

int effective_modify_mask(ibv_qp_type type, int attr_mask) {
  switch (type) {
    case IBV_QPT_XRC_SEND:
      return attr_mask & ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    case IBV_QPT_XRC_RECV:
      return attr_mask & ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
    default:
      return attr_mask;
  }
}

ibv_qp_state next_state(ibv_qp_state current, const ibv_qp_attr& attr, int attr_mask) {
  return (attr_mask & IBV_QP_STATE) ? attr.qp_state : current;
}

const char* qp_state_name(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

Result<void> check_modify_qp(const QpModifyContext& ctx, const ibv_qp_attr& attr, int attr_mask) {
  // The table has no column for other QP types (the kernel indexes by type).
  if (!is_supported_qp_type(ctx.type) || !is_state(ctx.current)) return invalid();

  // Bits past IBV_QP_DEST_QPN: rdma-core refuses >= RATE_LIMIT, uverbs the rest (EOPNOTSUPP).
  if (attr_mask & ~kLegacyModifyMask) return fail(std::errc::operation_not_supported);

  // --- what the uverbs layer checks before the core sees the call ---
  // The port must exist.
  if ((attr_mask & IBV_QP_PORT) && !port_valid(ctx, attr.port_num)) return invalid();
  if (attr_mask & IBV_QP_AV) {
    // The AV's port must exist.
    if (!port_valid(ctx, attr.ah_attr.port_num)) return invalid();
    if ((attr_mask & IBV_QP_STATE) && raw(attr.qp_state) == IBV_QPS_RTR) {
      // INIT->RTR: the AV must use the port bound at RESET->INIT.
      if (attr.ah_attr.port_num != ctx.qp_port) return invalid();
    } else if ((attr_mask & IBV_QP_PORT) && attr.port_num != attr.ah_attr.port_num) {
      // SQD->SQD moving both: the new port and the AV's port must agree.
      return invalid();
    }
  }
  // The alternate path names a valid port, the same in both of its fields.
  if ((attr_mask & IBV_QP_ALT_PATH) &&
      (!port_valid(ctx, attr.alt_port_num) || !port_valid(ctx, attr.alt_ah_attr.port_num) ||
       attr.alt_port_num != attr.alt_ah_attr.port_num))
    return invalid();
  // qp_state and cur_qp_state must be real states (IBV_QPS_UNKNOWN and beyond are not).
  if ((attr_mask & IBV_QP_CUR_STATE) && !is_state(raw(attr.cur_qp_state))) return invalid();
  if ((attr_mask & IBV_QP_STATE) && !is_state(raw(attr.qp_state))) return invalid();
  // Controlled Q_Keys (bit 31) need privilege (kernel >= 6.5: EPERM).
  if ((attr_mask & IBV_QP_QKEY) && (attr.qkey & kPrivilegedQkeyBit) &&
      !ctx.privileged_qkey_allowed)
    return fail(std::errc::operation_not_permitted);

  // XRC types lose the attributes they do not use before anything else looks.
  const int mask = effective_modify_mask(ctx.type, attr_mask);

  // --- what the core checks on address vectors ---
  if (mask & IBV_QP_AV) {
    if (auto r = check_ah(ctx, attr.ah_attr); !r) return r;
  }
  if (mask & IBV_QP_ALT_PATH) {
    if (auto r = check_ah(ctx, attr.alt_ah_attr); !r) return r;
    // The core handles alternate paths (APM) on InfiniBand only: banned on RoCE.
    if (ctx.ethernet_link) return invalid();
  }

  // --- the state machine (ib_modify_qp_is_ok) ---
  // softhca is strict about IBV_QP_CUR_STATE: it must name the state the QP is in.
  // (The kernel's drivers take the caller's word and look the transition up from it.)
  if ((mask & IBV_QP_CUR_STATE) && attr.cur_qp_state != ctx.current) return invalid();
  // IBV_QP_CUR_STATE is only meaningful from RTR, RTS, SQD and SQE.
  if ((mask & IBV_QP_CUR_STATE) && ctx.current != IBV_QPS_RTR && ctx.current != IBV_QPS_RTS &&
      ctx.current != IBV_QPS_SQD && ctx.current != IBV_QPS_SQE)
    return invalid();
  // Without IBV_QP_STATE the call is a pure attribute change: the cur->cur cell
  // decides (valid for RESET, INIT, RTS, SQD, ERR; not for RTR or SQE).
  const ibv_qp_state to = next_state(ctx.current, attr, mask);
  const QpTransitionRule rule = qp_transition_rule(ctx.type, ctx.current, to);
  // The transition must exist for this QP type.
  if (!rule.valid) return invalid();
  // Every required attribute must be present.
  if ((mask & rule.required_mask) != rule.required_mask) return invalid();
  // Nothing outside required | optional | STATE may be present (e.g. IBV_QP_CAP never is).
  if (mask & ~(rule.required_mask | rule.optional_mask | IBV_QP_STATE)) return invalid();
  // A QP whose SQ is still draining in SQD may only be torn down (rxe: EINVAL).
  if (ctx.current == IBV_QPS_SQD && ctx.sq_draining && to != IBV_QPS_ERR && to != IBV_QPS_RESET)
    return invalid();

  // --- value ranges (rxe_qp_chk_attr and the hardware drivers) ---
  // The P_Key index must lie inside the P_Key table.
  if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index >= ctx.pkey_table_len) return invalid();
  if ((mask & IBV_QP_ALT_PATH) && attr.alt_pkey_index >= ctx.pkey_table_len) return invalid();
  // path_mtu is an enum ibv_mtu (1..5) no larger than the port's MTU.
  if ((mask & IBV_QP_PATH_MTU) &&
      (raw(attr.path_mtu) < IBV_MTU_256 || raw(attr.path_mtu) > ctx.max_path_mtu))
    return invalid();
  // Outstanding reads/atomics we initiate cannot exceed max_qp_init_rd_atom.
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > ctx.max_rd_atomic) return invalid();
  // Reads/atomics we answer cannot exceed max_qp_rd_atom.
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > ctx.max_dest_rd_atomic)
    return invalid();
  // The local ACK timeout is a 5-bit exponent.
  if ((mask & IBV_QP_TIMEOUT) && attr.timeout > 31) return invalid();
  if ((mask & IBV_QP_ALT_PATH) && attr.alt_timeout > 31) return invalid();
  // retry_cnt and rnr_retry are 3-bit counters (7 = infinite RNR retries).
  if ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) return invalid();
  if ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) return invalid();
  // min_rnr_timer is a 5-bit code (IBTA table 45).
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) return invalid();
  // Access flags: no bit that no ibv_access_flags name defines (softhca; kernel ignores them).
  if ((mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~kQpAccessFlagsKnown))
    return invalid();
  // The remote QPN is a 24-bit field (softhca: the kernel would truncate).
  if ((mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > kQpnMask) return invalid();
  // path_mig_state is MIGRATED, REARM or ARMED.
  if ((mask & IBV_QP_PATH_MIG_STATE) &&
      (raw(attr.path_mig_state) < IBV_MIG_MIGRATED || raw(attr.path_mig_state) > IBV_MIG_ARMED))
    return invalid();
  return {};
}

QpModifyContext make_modify_context(ibv_qp_type type, const QpAttributes& attrs) {
  QpModifyContext ctx;
  ctx.type = type;
  ctx.current = attrs.state;
  ctx.qp_port = attrs.port_num;
  ctx.sq_draining = attrs.sq_draining;
  return ctx;
}

void apply_modify_qp(QpAttributes& attrs, const ibv_qp_attr& attr, int attr_mask,
                     ibv_qp_type type) {
  const int mask = effective_modify_mask(type, attr_mask);
  const ibv_qp_state from = attrs.state;
  const ibv_qp_state to = next_state(from, attr, mask);

  // Entering RESET forgets everything, as a hardware QP context is cleared.
  if (to == IBV_QPS_RESET) {
    attrs = QpAttributes{};
    return;
  }

  if (mask & IBV_QP_QKEY) attrs.qkey = attr.qkey;
  if (mask & IBV_QP_PKEY_INDEX) attrs.pkey_index = attr.pkey_index;
  if (mask & IBV_QP_PORT) attrs.port_num = attr.port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) attrs.access_flags = attr.qp_access_flags;
  if (mask & IBV_QP_PATH_MTU) attrs.path_mtu = attr.path_mtu;
  if (mask & IBV_QP_PATH_MIG_STATE) attrs.path_mig_state = attr.path_mig_state;
  if (mask & IBV_QP_DEST_QPN) attrs.dest_qpn = attr.dest_qp_num;
  // The kernel masks oversized PSNs to 24 bits (with a warning) rather than failing.
  if (mask & IBV_QP_RQ_PSN) attrs.rq_psn = attr.rq_psn & kPsnMask;
  if (mask & IBV_QP_SQ_PSN) attrs.sq_psn = attr.sq_psn & kPsnMask;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) attrs.max_rd_atomic = attr.max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) attrs.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) attrs.min_rnr_timer = attr.min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) attrs.timeout = attr.timeout;
  if (mask & IBV_QP_RETRY_CNT) attrs.retry_cnt = attr.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) attrs.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& a = attr.ah_attr;
    QpAddressVector av;
    av.is_global = a.is_global != 0;
    if (av.is_global) {
      std::memcpy(av.dgid.data(), a.grh.dgid.raw, av.dgid.size());
      av.flow_label = a.grh.flow_label & wire::kFlowLabelMask;
      av.sgid_index = a.grh.sgid_index;
      av.hop_limit = a.grh.hop_limit;
      av.traffic_class = a.grh.traffic_class;
    }
    av.dlid = a.dlid;
    av.sl = a.sl;
    av.src_path_bits = a.src_path_bits;
    av.static_rate = a.static_rate;
    av.port_num = a.port_num;
    attrs.ah = av;
  }
  // IBV_QP_ALT_PATH is accepted on InfiniBand links but not kept (no APM).

  if (to != from && to == IBV_QPS_SQD) {
    // Entering SQD: the send queue drains; the async notify applies to this entry.
    attrs.sq_draining = true;
    attrs.en_sqd_async_notify =
        (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) != 0 && attr.en_sqd_async_notify != 0;
  } else if (to != IBV_QPS_SQD) {
    attrs.sq_draining = false;
    attrs.en_sqd_async_notify = false;
  }
  attrs.state = to;
}

void mark_sq_drained(QpAttributes& attrs) { attrs.sq_draining = false; }

void query_qp_attributes(const QpAttributes& attrs, ibv_qp_attr& out) {
  const ibv_qp_cap cap = out.cap;
  out = ibv_qp_attr{};
  out.cap = cap;
  out.qp_state = attrs.state;
  out.cur_qp_state = attrs.state;
  out.path_mtu = attrs.path_mtu;
  out.path_mig_state = attrs.path_mig_state;
  out.qkey = attrs.qkey;
  out.rq_psn = attrs.rq_psn;
  out.sq_psn = attrs.sq_psn;
  out.dest_qp_num = attrs.dest_qpn;
  out.qp_access_flags = attrs.access_flags;
  out.pkey_index = attrs.pkey_index;
  out.en_sqd_async_notify = attrs.en_sqd_async_notify ? 1 : 0;
  out.sq_draining = attrs.sq_draining ? 1 : 0;
  out.max_rd_atomic = attrs.max_rd_atomic;
  out.max_dest_rd_atomic = attrs.max_dest_rd_atomic;
  out.min_rnr_timer = attrs.min_rnr_timer;
  out.port_num = attrs.port_num;
  out.timeout = attrs.timeout;
  out.retry_cnt = attrs.retry_cnt;
  out.rnr_retry = attrs.rnr_retry;
  ibv_ah_attr& a = out.ah_attr;
  std::memcpy(a.grh.dgid.raw, attrs.ah.dgid.data(), attrs.ah.dgid.size());
  a.grh.flow_label = attrs.ah.flow_label;
  a.grh.sgid_index = attrs.ah.sgid_index;
  a.grh.hop_limit = attrs.ah.hop_limit;
  a.grh.traffic_class = attrs.ah.traffic_class;
  a.dlid = attrs.ah.dlid;
  a.sl = attrs.ah.sl;
  a.src_path_bits = attrs.ah.src_path_bits;
  a.static_rate = attrs.ah.static_rate;
  a.is_global = attrs.ah.is_global ? 1 : 0;
  a.port_num = attrs.ah.port_num;
}

}  // namespace softhca::engine
