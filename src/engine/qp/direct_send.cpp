// The requester's common case, done on the spot: an RC WRITE, READ, atomic
// or SEND of one local range, posted to an idle send queue, whose link can
// complete it at once (link::Channel::copy_direct, or send_direct for a
// SEND: the shm link, peer and memory on this host). No WQE is queued for
// it and no request is built: the local range is
// checked as local_iovecs (requester.cpp) would check it, the link copies,
// and the WQE completes as the general path would complete it. Whenever a
// condition does not hold, nothing has happened yet and the WR goes the
// general way, which gives every other outcome.
#include <cstring>

#include "common/limits.hpp"
#include "common/log.hpp"
#include "engine/node.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/queue_pair.hpp"
#include "host/host_registry.hpp"
#include "link/key_grant.hpp"
#include "link/registered_key.hpp"
#include "transport/memory_key.hpp"

namespace softhca::engine {

// The local SGE's checks as local_iovecs asks them: an MR of this process
// (another's is staged: the general path), not on-demand (its pages are
// checked when used), in the QP's PD, granting `needed` over the range; the
// range through our window onto the MR's pages where they moved into our
// file. Where they hold, the key's grant is worked out for the next posts.
char* QueuePair::direct_local_range(const ibv_sge& sge, uint32_t needed) {
  direct_local_grant_ = link::KeyGrant{};
  if (!node_.registry().lookup_mr_cached(sge.lkey, direct_local_key_) || direct_local_key_.record.proc != node_.proc())
    return nullptr;
  const host::MrRecord& mr = direct_local_key_.record;
  const transport::MemoryKey key = link::registered_key(mr);
  if (transport::is_on_demand(key) || !transport::local_key_allows(key, pd_->id(), needed, sge.addr, sge.length))
    return nullptr;
  char* at = static_cast<char*>(transport::owner_address(key, sge.addr));
  if (char* in_file = node_.host().in_backing(node_.proc(), mr.shared, reinterpret_cast<uint64_t>(at), sge.length,
                                              direct_local_window_))
    at = in_file;
  direct_local_grant_ = link::local_grant(key, mr.shared, direct_local_key_.seq, pd_->id(), direct_local_window_);
  return at;
}

bool QueuePair::post_direct_locked(const ibv_send_wr& wr) {
  using Kind = link::DirectCopy::Kind;
  link::DirectCopy op;
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
      op.kind = Kind::kWrite;
      break;
    case IBV_WR_RDMA_READ:
      op.kind = Kind::kRead;
      break;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      op.kind = Kind::kFetchAdd;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      op.kind = Kind::kCompareSwap;
      break;
    case IBV_WR_SEND:
      op.kind = Kind::kSend;
      break;
    case IBV_WR_SEND_WITH_IMM:
      op.kind = Kind::kSendWithImm;
      op.imm_data = wr.imm_data;
      break;
    default:
      return false;
  }
  // RC; UC posts only WRITEs and SENDs (validate_send). One SGE, or inline
  // data in any number of them (gathered here, as enqueue_send_locked would).
  const bool inline_data = (wr.send_flags & IBV_SEND_INLINE) != 0;
  if ((init_.type != IBV_QPT_RC && init_.type != IBV_QPT_UC) || wr.num_sge < 1 ||
      (!inline_data && wr.num_sge != 1) || !channel_ || sq_sent_ != sq_head_ ||
      sq_tail_.load(std::memory_order_relaxed) != sq_head_ || parked_ ||
      shared_->state.load(std::memory_order_acquire) != IBV_QPS_RTS)
    return false;
  const bool atomic = op.kind == Kind::kFetchAdd || op.kind == Kind::kCompareSwap;
  const bool send = op.kind == Kind::kSend || op.kind == Kind::kSendWithImm;
  const bool read = op.kind != Kind::kWrite && !send;  // into local memory
  if (atomic) {
    op.remote_addr = wr.wr.atomic.remote_addr;
    op.rkey = wr.wr.atomic.rkey;
    op.compare_add = wr.wr.atomic.compare_add;
    op.swap = wr.wr.atomic.swap;
  } else if (send) {
    op.src_qpn = qpn_;
    op.solicited = (wr.send_flags & IBV_SEND_SOLICITED) != 0;
  } else {
    op.remote_addr = wr.wr.rdma.remote_addr;
    op.rkey = wr.wr.rdma.rkey;
  }
  alignas(16) unsigned char gathered[limits::kMaxInlineData];
  if (inline_data) {
    // validate_send checked the total against max_inline_data (and refused
    // inline READs and atomics); the bytes are taken now.
    if (wr.num_sge == 1) {
      op.local = reinterpret_cast<void*>(wr.sg_list[0].addr);
      op.length = wr.sg_list[0].length;
    } else {
      uint64_t total = 0;
      for (int i = 0; i < wr.num_sge; ++i) {
        const ibv_sge& piece = wr.sg_list[i];
        if (piece.length == 0) continue;  // (its address may be 0)
        if (piece.length > sizeof gathered - total) return false;
        std::memcpy(gathered + total, reinterpret_cast<const void*>(piece.addr), piece.length);
        total += piece.length;
      }
      op.local = gathered;
      op.length = total;
    }
    if (op.length == 0) return false;
  } else {
    const ibv_sge& sge = wr.sg_list[0];
    // An atomic's local SGE other than 8 bytes is LOC_LEN_ERR: the general path's.
    if (sge.length == 0 || (atomic && sge.length != 8)) return false;
    op.length = sge.length;
    const uint32_t needed = read ? IBV_ACCESS_LOCAL_WRITE : 0;
    // The key as the last operation found it, while its slot has not changed.
    char* at = direct_local_grant_.find_current(node_.registry(), sge.lkey, needed, sge.addr, sge.length);
    if (at == nullptr && (at = direct_local_range(sge, needed)) == nullptr) return false;
    op.local = at;
  }
  if (!(send ? channel_->send_direct(op) : channel_->copy_direct(op))) return false;
  if (op.landed != nullptr) {
    last_direct_addr_.store(op.remote_addr, std::memory_order_relaxed);
    last_direct_landed_.store(op.landed, std::memory_order_relaxed);
  }
  complete_direct_locked(wr, op.length);
  return true;
}

// post_direct_locked for the shape of a latency test's WRITE (one SGE,
// inline or not), asking the same conditions without the DirectCopy and the
// dispatches on the opcode that the other kinds need: the instructions
// between the peer's signal and this WRITE's store are its latency
// (docs/performance.md).
bool QueuePair::post_write_direct_locked(const ibv_send_wr& wr) {
  if ((init_.type != IBV_QPT_RC && init_.type != IBV_QPT_UC) || !channel_ || sq_sent_ != sq_head_ ||
      sq_tail_.load(std::memory_order_relaxed) != sq_head_ || parked_ ||
      shared_->state.load(std::memory_order_acquire) != IBV_QPS_RTS)
    return false;
  const ibv_sge& sge = wr.sg_list[0];
  if (sge.length == 0) return false;
  const void* local;
  if (wr.send_flags & IBV_SEND_INLINE) {
    local = reinterpret_cast<const void*>(sge.addr);  // validate_send checked its length against max_inline_data
  } else {
    local = direct_local_grant_.find_current(node_.registry(), sge.lkey, 0, sge.addr, sge.length);
    if (local == nullptr && (local = direct_local_range(sge, 0)) == nullptr) return false;
  }
  void* landed = channel_->write_direct(local, sge.length, wr.wr.rdma.remote_addr, wr.wr.rdma.rkey);
  if (landed == nullptr) return false;
  complete_direct_write_locked(wr, landed);
  return true;
}

// The WQE of a WR done on the spot, completed as the general path completes
// a WQE that the responder acknowledged.
void QueuePair::complete_direct_locked(const ibv_send_wr& wr, uint64_t length) {
  SendWqe* wqe = sq_slot(sq_head_);
  wqe->wr_id = wr.wr_id;
  wqe->opcode = wr.opcode;
  wqe->send_flags = wr.send_flags;
  wqe->num_sge = 0;
  wqe->inline_len = 0;
  wqe->length = length;
  wqe->retry = transport::RetryState::start(attrs_.rnr_retry, attrs_.retry_cnt);
  wqe->ah = nullptr;
  wqe->mw = nullptr;
  ++sq_head_;
  complete_send_locked(*wqe, IBV_WC_SUCCESS);
}

}  // namespace softhca::engine
