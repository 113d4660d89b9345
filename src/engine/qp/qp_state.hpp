// The QP state machine: which ibv_modify_qp calls are legal, and the engine's
// copy of the attributes they set. Pure functions: no I/O, no threads, no locks.
//
// The transition table mirrors the Linux kernel's (ib_modify_qp_is_ok), since
// that is what every rdma-core provider behind libibverbs enforces; the value
// checks follow the uverbs layer, the core and rxe, plus the limits in
// common/limits.hpp. Where softhca is stricter than the kernel, the rule's
// comment in qp_state.cpp says so.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>

#include "common/result.hpp"
#include "common/limits.hpp"

namespace softhca::engine {

// States RESET..ERR are 0..6 in enum ibv_qp_state; IBV_QPS_UNKNOWN is not a state.
inline constexpr int kNumQpStates = IBV_QPS_ERR + 1;

// Every attribute bit the legacy ibv_modify_qp path carries (IBV_QP_STATE up to
// IBV_QP_DEST_QPN). Bits above it fail with EOPNOTSUPP, as in rdma-core/uverbs.
inline constexpr int kLegacyModifyMask = (IBV_QP_DEST_QPN << 1) - 1;

// PSNs and QPNs are 24-bit wire fields.
inline constexpr uint32_t kPsnMask = 0xFFFFFF;
inline constexpr uint32_t kQpnMask = 0xFFFFFF;

// The IBTA "controlled" Q_Key bit: user space may set it only when privileged.
inline constexpr uint32_t kPrivilegedQkeyBit = 0x80000000U;

// QP access flags we accept in IBV_QP_ACCESS_FLAGS: every named ibv_access_flags
// bit of rdma-core 44 plus the optional range (the kernel ignores unknown bits;
// softhca rejects bits no header names). Only the remote ones affect a QP.
inline constexpr unsigned kQpAccessFlagsKnown =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_OPTIONAL_RANGE;

// One cell of the transition table, for one QP type. Masks exclude IBV_QP_STATE,
// which is always allowed (and is what selects the cell).
struct QpTransitionRule {
  int required_mask = 0;
  int optional_mask = 0;
  bool valid = false;
};

// True for the QP types the table covers: RC, UC, UD, RAW_PACKET, XRC_SEND, XRC_RECV.
bool is_supported_qp_type(ibv_qp_type type);

// The table cell for (type, from, to). Unknown types or states give {0, 0, false}.
QpTransitionRule qp_transition_rule(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to);

// The kernel silently drops attributes an XRC QP type does not use before it
// checks the table (uverbs modify_qp_mask): XRC_SEND loses MAX_DEST_RD_ATOMIC and
// MIN_RNR_TIMER, XRC_RECV loses MAX_QP_RD_ATOMIC, RETRY_CNT and RNR_RETRY.
// Identity for all other types. check and apply both use this mask.
int effective_modify_mask(ibv_qp_type type, int attr_mask);

// What the device and the QP look like to one ibv_modify_qp call.
struct QpModifyContext {
  ibv_qp_type type = IBV_QPT_RC;
  ibv_qp_state current = IBV_QPS_RESET;
  uint8_t qp_port = 0;            // port bound at RESET->INIT (0 while in RESET)
  bool sq_draining = false;       // in SQD, the send queue has not drained yet
  uint8_t port_count = limits::kPhysPortCnt;
  uint16_t pkey_table_len = limits::kMaxPkeys;
  int gid_table_len = limits::kGidTableLen;
  uint64_t populated_gids = ~uint64_t{0};  // bit i: GID index i holds an entry (i < 64)
  bool ethernet_link = true;               // RoCE: every AV must carry a GRH
  bool privileged_qkey_allowed = true;     // may set kPrivilegedQkeyBit in a Q_Key
  int max_path_mtu = limits::kMtu;
  int max_rd_atomic = limits::kMaxQpInitRdAtom;
  int max_dest_rd_atomic = limits::kMaxQpRdAtom;
};

// Validates one ibv_modify_qp(attr, attr_mask) against ctx. Errors:
//   operation_not_supported  mask bits above IBV_QP_DEST_QPN (rdma-core/uverbs)
//   operation_not_permitted  a privileged Q_Key without the privilege
//   no_message_available     (ENODATA) AV sgid_index inside the table but empty
//   invalid_argument         everything else (bad transition, mask or value)
Result<void> check_modify_qp(const QpModifyContext& ctx, const ibv_qp_attr& attr, int attr_mask);

// The state after a successful modify: attr.qp_state if IBV_QP_STATE is set.
ibv_qp_state next_state(ibv_qp_state current, const ibv_qp_attr& attr, int attr_mask);

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "UNKNOWN" otherwise.
const char* qp_state_name(ibv_qp_state state);

// The engine's copy of a QP's address vector (primary path).
struct QpAddressVector {
  std::array<uint8_t, 16> dgid{};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
  uint16_t dlid = 0;
  uint8_t sl = 0;
  uint8_t src_path_bits = 0;
  uint8_t static_rate = 0;
  bool is_global = false;
  uint8_t port_num = 0;

  bool operator==(const QpAddressVector&) const = default;
};

// The engine's copy of what ibv_modify_qp sets. The alternate path is accepted
// (on InfiniBand links) but not kept: softhca has no path migration.
// Default-constructed == a QP in RESET (what a transition to RESET restores).
struct QpAttributes {
  ibv_qp_state state = IBV_QPS_RESET;
  uint32_t qkey = 0;
  uint16_t pkey_index = 0;
  uint8_t port_num = 0;
  unsigned access_flags = 0;
  ibv_mtu path_mtu = IBV_MTU_256;  // rxe's create-time default
  ibv_mig_state path_mig_state = IBV_MIG_MIGRATED;
  uint32_t dest_qpn = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  QpAddressVector ah;
  // Set on entering SQD (the send queue starts draining); the data path clears
  // it with mark_sq_drained() once no send WR is outstanding.
  bool sq_draining = false;
  bool en_sqd_async_notify = false;

  bool operator==(const QpAttributes&) const = default;
};

// A QpModifyContext for a QP of `type` whose attributes are `attrs`, on the
// default softhca device (limits.hpp, RoCE). Callers adjust device fields.
QpModifyContext make_modify_context(ibv_qp_type type, const QpAttributes& attrs);

// Applies a modify that check_modify_qp accepted (validate, then apply, like
// rxe's chk_attr/from_attr). A transition to RESET restores the defaults.
// PSNs are stored masked to 24 bits, as the kernel does. `type` only matters
// for XRC QPs, whose ignored attributes (effective_modify_mask) are not stored.
void apply_modify_qp(QpAttributes& attrs, const ibv_qp_attr& attr, int attr_mask,
                     ibv_qp_type type = IBV_QPT_RC);

// The send queue of a QP in SQD finished draining.
void mark_sq_drained(QpAttributes& attrs);

// Fills `out` from `attrs` for ibv_query_qp. `out.cap` is left as the caller
// set it (the QP's capacities live with the queues, not here); the alternate
// path reads back as zero.
void query_qp_attributes(const QpAttributes& attrs, ibv_qp_attr& out);

}  // namespace softhca::engine
