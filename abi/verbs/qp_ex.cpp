// The new post-send API: ibv_qp_to_qp_ex and the ibv_qp_ex wr_* ops.
//
// A QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS gets a QpExBatch, storage
// for one batch of work requests sized at creation by the granted caps
// (max_send_wr WRs, max_send_sge SGEs each, max_inline_data bytes of inline
// data each), so building a batch never allocates. Then:
//   wr_start     takes the batch lock (one builder per QP at a time, as the
//                rdma-core providers hold their SQ lock) and empties the batch;
//   an opcode op (wr_send, wr_rdma_write, ...) appends an ibv_send_wr, taking
//                wr_id and send_flags from qpx->wr_id / qpx->wr_flags now;
//   a setter     (wr_set_sge, wr_set_inline_data, wr_set_ud_addr, ...) fills in
//                the last WR appended; inline data is copied at once, so the
//                caller may reuse its buffer when the setter returns;
//   wr_complete  hands the chain to the engine's QueuePair::post_send, the path
//                of ibv_post_send (same checks: QP state, opcode per QP type,
//                SGE and inline limits, SQ space), and returns its errno;
//   wr_abort     drops the batch.
// The first error while building (no room left in the batch, too many SGEs,
// too much inline data, a setter before any opcode, an operation this device
// does not offer) is remembered, the rest of the batch is ignored, nothing is
// posted, and wr_complete returns that error. If the engine refuses a WR in the
// middle of a chain, the WRs before it are posted (ibv_post_send semantics).
//
// Operations offered: SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM,
// RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, ATOMIC_WRITE,
// SEND_WITH_INV, BIND_MW and LOCAL_INV (per QP type as the engine allows
// them). TSO and FLUSH (1 << 11, newer headers) are refused at creation with
// EOPNOTSUPP (pyverbs skips on that);
// their ops are still installed and make wr_complete return EOPNOTSUPP.
// wr_set_xrc_srqn names the receiving SRQ of an XRC INI QP's WR.
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "engine/qp/queue_pair.hpp"
#include "ext_verbs.hpp"
#include "handles.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace softhca::abi {

struct QpExBatch {
  uint64_t send_ops_flags = 0;
  uint32_t capacity = 0;    // WRs one batch can hold
  uint32_t max_sge = 0;     // SGE slots per WR
  uint32_t max_inline = 0;  // inline bytes per WR
  uint32_t count = 0;       // WRs in the open batch
  int err = 0;              // first error of the open batch
  // Between wr_start and wr_complete/wr_abort, and by which thread. Atomic
  // (relaxed) only so that a misuse from another thread is not a data race.
  std::atomic<bool> open{false};
  std::atomic<std::thread::id> owner{};
  SpinLock lock;
  std::unique_ptr<ibv_send_wr[]> wrs;
  std::unique_ptr<ibv_sge[]> sges;
  std::unique_ptr<unsigned char[]> inline_data;
};

void QpExBatchDeleter::operator()(QpExBatch* batch) const noexcept { delete batch; }

}  // namespace softhca::abi

namespace {

constexpr uint64_t kRcSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                                IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                                IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_BIND_MW |
                                IBV_QP_EX_WITH_LOCAL_INV;
constexpr uint64_t kUcSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
constexpr uint64_t kUdSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

QpHandle& handle_of(ibv_qp_ex* qpx) { return *reinterpret_cast<QpHandle*>(qpx); }

void fail(QpExBatch& b, int err) {
  if (b.err == 0) b.err = err;
}

// Appends a WR for an opcode op; nullptr when the batch is closed or failed.
ibv_send_wr* append(ibv_qp_ex* qpx, ibv_wr_opcode opcode) {
  QpHandle& h = handle_of(qpx);
  QpExBatch& b = *h.batch;
  if (!b.open || b.err != 0) return nullptr;
  if (b.count >= b.capacity) {
    fail(b, ENOMEM);  // more WRs than the send queue holds
    return nullptr;
  }
  ibv_send_wr& wr = b.wrs[b.count];
  std::memset(&wr, 0, sizeof wr);
  wr.wr_id = qpx->wr_id;
  wr.send_flags = qpx->wr_flags;
  wr.opcode = opcode;
  wr.sg_list = &b.sges[uint64_t{b.count} * b.max_sge];
  if (b.count > 0) b.wrs[b.count - 1].next = &wr;
  ++b.count;
  return &wr;
}

// The WR a setter applies to: the last one appended.
ibv_send_wr* current(ibv_qp_ex* qpx) {
  QpExBatch& b = *handle_of(qpx).batch;
  if (!b.open || b.err != 0) return nullptr;
  if (b.count == 0) {
    fail(b, EINVAL);  // a setter before any opcode
    return nullptr;
  }
  return &b.wrs[b.count - 1];
}

void refuse(ibv_qp_ex* qpx) {
  QpExBatch& b = *handle_of(qpx).batch;
  if (b.open) fail(b, EOPNOTSUPP);
}

// --- opcodes ---

void wr_send(ibv_qp_ex* qpx) { append(qpx, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm_data) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_SEND_WITH_IMM)) wr->imm_data = imm_data;
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_RDMA_WRITE)) wr->wr.rdma = {remote_addr, rkey};
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_RDMA_WRITE_WITH_IMM)) {
    wr->wr.rdma = {remote_addr, rkey};
    wr->imm_data = imm_data;
  }
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_RDMA_READ)) wr->wr.rdma = {remote_addr, rkey};
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t compare, uint64_t swap) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_ATOMIC_CMP_AND_SWP)) wr->wr.atomic = {remote_addr, compare, swap, rkey};
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD)) wr->wr.atomic = {remote_addr, add, 0, rkey};
}

// RDMA ATOMIC WRITE: the 8 bytes at atomic_wr are taken now, as a value.
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, const void* atomic_wr) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_ATOMIC_WRITE)) {
    uint64_t value = 0;
    if (atomic_wr != nullptr) std::memcpy(&value, atomic_wr, sizeof value);
    wr->wr.atomic = {remote_addr, value, 0, rkey};
    wr->send_flags |= engine::kSendFlagAtomicWriteValue;
  }
}

// XRC INI QPs: the SRQ at the responder that receives the WR (any opcode).
// Other QPs have no such field: the batch fails as with an operation not offered.
void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t remote_srqn) {
  if (qpx->qp_base.qp_type != IBV_QPT_XRC_SEND) return refuse(qpx);
  if (ibv_send_wr* wr = current(qpx)) wr->qp_type.xrc.remote_srqn = remote_srqn;
}

// SEND WITH INVALIDATE: its SGEs or inline data follow as for wr_send.
void wr_send_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_SEND_WITH_INV)) wr->invalidate_rkey = invalidate_rkey;
}

// A bind carries no SGE: the MR and range are in `bind_info`, taken now.
void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bind_info) {
  if (mw == nullptr || bind_info == nullptr) {
    QpExBatch& b = *handle_of(qpx).batch;
    if (b.open) fail(b, EINVAL);
    return;
  }
  if (ibv_send_wr* wr = append(qpx, IBV_WR_BIND_MW)) {
    wr->bind_mw.mw = mw;
    wr->bind_mw.rkey = rkey;
    wr->bind_mw.bind_info = *bind_info;
  }
}

void wr_local_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* wr = append(qpx, IBV_WR_LOCAL_INV)) wr->invalidate_rkey = invalidate_rkey;
}

// Not offered (refused at creation too): wr_complete returns EOPNOTSUPP.
void wr_send_tso(ibv_qp_ex* qpx, void*, uint16_t, uint16_t) { refuse(qpx); }

// --- setters ---

void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (ibv_send_wr* wr = current(qpx)) wr->wr.ud = {ah, remote_qpn, remote_qkey};
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  ibv_send_wr* wr = current(qpx);
  if (wr == nullptr) return;
  // A zero-length message carries no SGE (as rxe and mlx5 do).
  wr->num_sge = length != 0 ? 1 : 0;
  wr->sg_list[0] = ibv_sge{addr, length, lkey};
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* sg_list) {
  ibv_send_wr* wr = current(qpx);
  if (wr == nullptr) return;
  QpExBatch& b = *handle_of(qpx).batch;
  if (num_sge > b.max_sge || (num_sge > 0 && sg_list == nullptr)) {
    fail(b, EINVAL);  // what ibv_post_send answers for too many SGEs
    return;
  }
  if (num_sge > 0) std::memcpy(wr->sg_list, sg_list, num_sge * sizeof *sg_list);
  wr->num_sge = static_cast<int>(num_sge);
}

// Copies the data now into the WR's inline slot; the engine copies it again
// into its send queue at wr_complete, as ibv_post_send does with IBV_SEND_INLINE.
void set_inline(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* bufs) {
  ibv_send_wr* wr = current(qpx);
  if (wr == nullptr) return;
  QpExBatch& b = *handle_of(qpx).batch;
  const uint32_t index = static_cast<uint32_t>(wr - b.wrs.get());
  unsigned char* slot = b.inline_data.get() + uint64_t{index} * b.max_inline;
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (bufs[i].length > b.max_inline - total) {
      fail(b, EINVAL);  // more than max_inline_data, as ibv_post_send answers
      return;
    }
    if (bufs[i].length > 0) std::memcpy(slot + total, bufs[i].addr, bufs[i].length);
    total += bufs[i].length;
  }
  wr->send_flags |= IBV_SEND_INLINE;
  wr->num_sge = total != 0 ? 1 : 0;
  wr->sg_list[0] = ibv_sge{reinterpret_cast<uintptr_t>(slot), static_cast<uint32_t>(total), 0};
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  set_inline(qpx, 1, &buf);
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* buf_list) {
  if (num_buf > 0 && buf_list == nullptr) {
    if (current(qpx) != nullptr) fail(*handle_of(qpx).batch, EINVAL);
    return;
  }
  set_inline(qpx, num_buf, buf_list);
}

// --- batch ---

void close_batch(QpExBatch& b) {
  b.count = 0;
  b.err = 0;
  b.open.store(false, std::memory_order_relaxed);
  b.owner.store(std::thread::id{}, std::memory_order_relaxed);
  b.lock.unlock();
}

void wr_start(ibv_qp_ex* qpx) {
  QpExBatch& b = *handle_of(qpx).batch;
  const std::thread::id self = std::this_thread::get_id();
  // A second wr_start from the thread that holds the batch restarts it rather
  // than deadlocking on the lock it already holds.
  if (b.owner.load(std::memory_order_relaxed) != self) b.lock.lock();
  b.open.store(true, std::memory_order_relaxed);
  b.owner.store(self, std::memory_order_relaxed);
  b.count = 0;
  b.err = 0;
}

int wr_complete(ibv_qp_ex* qpx) {
  QpHandle& h = handle_of(qpx);
  QpExBatch& b = *h.batch;
  if (!b.open) return fail_with(EINVAL);  // no wr_start
  int ret = b.err;
  if (ret == 0 && b.count > 0) {
    ibv_send_wr* bad = nullptr;
    ret = int_verb([&] { return h.impl->post_send(&b.wrs[0], &bad); });
  }
  close_batch(b);
  return ret == 0 ? 0 : fail_with(ret);
}

void wr_abort(ibv_qp_ex* qpx) {
  QpExBatch& b = *handle_of(qpx).batch;
  if (b.open) close_batch(b);
}

}  // namespace

namespace softhca::abi {

int check_send_ops_flags(ibv_qp_type type, uint64_t send_ops_flags) {
  uint64_t supported = 0;
  switch (type) {
    case IBV_QPT_RC:
      supported = kRcSendOps;
      break;
    case IBV_QPT_UC:
      supported = kUcSendOps;
      break;
    case IBV_QPT_UD:
      supported = kUdSendOps;
      break;
    case IBV_QPT_XRC_SEND:
      supported = kRcSendOps & ~uint64_t{IBV_QP_EX_WITH_ATOMIC_WRITE};  // ATOMIC WRITE is RC's alone here
      break;
    case IBV_QPT_RAW_PACKET:
      supported = IBV_QP_EX_WITH_SEND;  // a frame: no immediate, no TSO
      break;
    default:
      return EOPNOTSUPP;
  }
  return (send_ops_flags & ~supported) != 0 ? EOPNOTSUPP : 0;
}

void enable_qp_ex(QpHandle& h, uint64_t send_ops_flags, const ibv_qp_cap& granted) {
  auto b = std::make_unique<QpExBatch>();
  b->send_ops_flags = send_ops_flags;
  b->capacity = granted.max_send_wr > 0 ? granted.max_send_wr : 1;
  b->max_sge = granted.max_send_sge > 0 ? granted.max_send_sge : 1;  // inline data takes one
  b->max_inline = granted.max_inline_data;
  b->wrs = std::make_unique_for_overwrite<ibv_send_wr[]>(b->capacity);
  b->sges = std::make_unique_for_overwrite<ibv_sge[]>(uint64_t{b->capacity} * b->max_sge);
  if (b->max_inline > 0)
    b->inline_data = std::make_unique_for_overwrite<unsigned char[]>(uint64_t{b->capacity} * b->max_inline);

  ibv_qp_ex& q = h.qp;
  q.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  q.wr_atomic_fetch_add = wr_atomic_fetch_add;
  q.wr_bind_mw = wr_bind_mw;
  q.wr_local_inv = wr_local_inv;
  q.wr_rdma_read = wr_rdma_read;
  q.wr_rdma_write = wr_rdma_write;
  q.wr_rdma_write_imm = wr_rdma_write_imm;
  q.wr_send = wr_send;
  q.wr_send_imm = wr_send_imm;
  q.wr_send_inv = wr_send_inv;
  q.wr_send_tso = wr_send_tso;
  q.wr_set_ud_addr = wr_set_ud_addr;
  q.wr_set_xrc_srqn = wr_set_xrc_srqn;
  q.wr_set_inline_data = wr_set_inline_data;
  q.wr_set_inline_data_list = wr_set_inline_data_list;
  q.wr_set_sge = wr_set_sge;
  q.wr_set_sge_list = wr_set_sge_list;
  q.wr_start = wr_start;
  q.wr_complete = wr_complete;
  q.wr_abort = wr_abort;
  q.wr_atomic_write = wr_atomic_write;
  h.batch.reset(b.release());
}

}  // namespace softhca::abi

extern "C" {

// As rdma-core with mlx5: the extended QP is handed out only for QPs created
// with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (rxe hands it out for every QP made by
// create_qp_ex). Only those have a batch and wr_* ops; for any other QP the
// ibv_qp_ex would hold NULL pointers that the inline ibv_wr_* call blindly.
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (qp == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* h = reinterpret_cast<QpHandle*>(qp);
  if (!h->batch) {
    errno = EOPNOTSUPP;  // created without IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
    return nullptr;
  }
  return &h->qp;
}

}  // extern "C"
