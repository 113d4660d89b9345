#include "engine/qp/shm_execute.hpp"

#include <arpa/inet.h>
#include <sys/uio.h>

#include <cstring>

#include "common/log.hpp"
#include "engine/address_handle.hpp"
#include "engine/device/device_info.hpp"
#include "engine/limits.hpp"
#include "engine/node.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/queue_pair.hpp"
#include "link/shm/remote_memory.hpp"

namespace softhca::engine {
namespace {

using Kind = ExecOutcome::Kind;

ExecOutcome done(ibv_wc_status status) { return {Kind::kDone, status, 0}; }
ExecOutcome no_response() { return {Kind::kNoResponse, IBV_WC_SUCCESS, 0}; }

constexpr uint32_t kMulticastQpn = 0xFFFFFF;  // IBA: the destination QP of every multicast packet

constexpr uint32_t kReceivableStates = (1u << IBV_QPS_RTR) | (1u << IBV_QPS_RTS) | (1u << IBV_QPS_SQD) | (1u << IBV_QPS_SQE);

// Holds a target QP against destruction while an initiator works on it.
class TargetUse {
 public:
  explicit TargetUse(shm::SharedQp* qp) : qp_(qp) { qp_->users.fetch_add(1, std::memory_order_acq_rel); }
  ~TargetUse() { qp_->users.fetch_sub(1, std::memory_order_release); }
  TargetUse(const TargetUse&) = delete;
  TargetUse& operator=(const TargetUse&) = delete;

 private:
  shm::SharedQp* qp_;
};

// Announces that this thread is about to reach registered memory of the
// target's process (HostRegistry::begin_access): a deregistration there
// waits for it to end. Keys are validated only after this.
class MemoryAccess {
 public:
  MemoryAccess(Node& node, uint32_t target_proc)
      : registry_(node.registry()), self_(node.proc()), slot_(registry_.begin_access(self_, target_proc)) {}
  ~MemoryAccess() { registry_.end_access(self_, slot_); }
  MemoryAccess(const MemoryAccess&) = delete;
  MemoryAccess& operator=(const MemoryAccess&) = delete;

 private:
  host::HostRegistry& registry_;
  uint32_t self_;
  uint32_t slot_;
};

// The keys of the target's memory an operation validated, as validated, so
// that a long copy can stop between chunks once one of them was deregistered
// or changed (the deregistration waits for the chunk under way only).
class KeysInUse {
 public:
  void add(const host::MrRecord& record) {
    if (n_ < kMax) records_[n_++] = record;
  }
  bool still_valid(Node& node) const {
    for (int i = 0; i < n_; ++i) {
      host::MrRecord now;
      const host::MrRecord& then = records_[i];
      if (!node.registry().lookup_mr(then.key, now) || now.proc != then.proc || now.pd_id != then.pd_id ||
          now.access != then.access || now.iova != then.iova || now.length != then.length ||
          now.host_addr != then.host_addr)
        return false;
    }
    return true;
  }

 private:
  static constexpr int kMax = limits::kMaxSge + 1;
  host::MrRecord records_[kMax];
  int n_ = 0;
};

// Copies of this size or less run as one; longer ones in chunks of it, the
// keys re-checked before each: the longest a deregistration waits.
constexpr size_t kFenceChunk = 1 << 20;

// write_to or read_from: (pid, dst, ndst, src, nsrc, bytes).
using CopyFn = shm::CopyResult (*)(uint32_t, const iovec*, int, const iovec*, int, size_t);

// `copy` of `length` bytes in kFenceChunk pieces, the keys re-checked before
// each piece after the first: a deregistration stops it (kFault).
shm::CopyResult fenced_copy(CopyFn copy, Node& node, const TargetQp& target, const iovec* dst, int ndst,
                            const iovec* src, int nsrc, uint64_t length, const KeysInUse& keys) {
  if (length <= kFenceChunk) return copy(target.pid, dst, ndst, src, nsrc, length);
  iovec dpart[limits::kMaxSge + 1], spart[limits::kMaxSge + 1];
  for (uint64_t offset = 0; offset < length; offset += kFenceChunk) {
    if (offset != 0 && !keys.still_valid(node)) return shm::CopyResult::kFault;
    const uint64_t bytes = length - offset < kFenceChunk ? length - offset : kFenceChunk;
    const int nd = shm::slice_iovecs(dst, ndst, offset, bytes, dpart);
    const int ns = shm::slice_iovecs(src, nsrc, offset, bytes, spart);
    const shm::CopyResult r = copy(target.pid, dpart, nd, spart, ns, bytes);
    if (r != shm::CopyResult::kOk) return r;
  }
  return shm::CopyResult::kOk;
}

// Into the target's memory (dst there), or out of it (src there).
shm::CopyResult fenced_write(Node& node, const TargetQp& target, const iovec* dst, int ndst, const iovec* src,
                             int nsrc, uint64_t length, const KeysInUse& keys) {
  return fenced_copy(&shm::write_to, node, target, dst, ndst, src, nsrc, length, keys);
}
shm::CopyResult fenced_read(Node& node, const TargetQp& target, const iovec* dst, int ndst, const iovec* src,
                            int nsrc, uint64_t length, const KeysInUse& keys) {
  return fenced_copy(&shm::read_from, node, target, dst, ndst, src, nsrc, length, keys);
}

// Finds QP `qpn` anywhere on the host; false if it does not exist or cannot be reached.
bool resolve(Node& node, uint32_t qpn, TargetQp& out) {
  const host::QpSlot* slot = node.registry().find_qp(qpn);
  if (slot == nullptr) return false;
  const uint32_t proc = slot->proc;
  const uint64_t offset = slot->shm_offset;
  if (node.registry().find_qp(qpn) != slot) return false;
  char* base = node.segment_base(proc);
  if (base == nullptr) return false;
  auto* qp = reinterpret_cast<shm::SharedQp*>(base + offset);
  if (qp->qpn != qpn) return false;
  out = TargetQp{qp, base, node.pid_of(proc), proc, qpn};
  return out.pid != 0;
}

// Validates local SGEs (lkeys of this process, the QP's PD, `access`) and turns them into iovecs.
ibv_wc_status local_iovecs(Node& node, uint32_t pd_id, const Sge* sges, uint32_t num_sge, uint32_t access,
                           iovec* out, int* nout, uint64_t* total) {
  int n = 0;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < num_sge; ++i) {
    const Sge& sge = sges[i];
    if (sge.length == 0) continue;
    host::MrRecord mr;
    if (!node.registry().lookup_mr(sge.lkey, mr) || mr.proc != node.proc() || mr.pd_id != pd_id ||
        (mr.access & access) != access || sge.addr < mr.iova || sge.addr + sge.length > mr.iova + mr.length ||
        sge.addr + sge.length < sge.addr)
      return IBV_WC_LOC_PROT_ERR;
    out[n].iov_base = reinterpret_cast<void*>(mr.host_addr + (sge.addr - mr.iova));
    out[n].iov_len = sge.length;
    ++n;
    sum += sge.length;
  }
  *nout = n;
  *total = sum;
  return IBV_WC_SUCCESS;
}

// Validates [addr, addr+len) under `rkey` at the target (QP access flags, PD, MR access, range).
bool remote_range(Node& node, const TargetQp& target, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access,
                  iovec* out, KeysInUse* keys = nullptr) {
  if ((target.qp->access.load(std::memory_order_acquire) & access) != access) return false;
  if (len == 0) {
    out->iov_base = nullptr;
    out->iov_len = 0;
    return true;
  }
  host::MrRecord mr;
  if (!node.registry().lookup_mr(rkey, mr) || mr.proc != target.proc || mr.pd_id != target.qp->pd_id ||
      (mr.access & access) != access || addr < mr.iova || addr + len > mr.iova + mr.length || addr + len < addr)
    return false;
  out->iov_base = reinterpret_cast<void*>(mr.host_addr + (addr - mr.iova));
  out->iov_len = len;
  if (keys) keys->add(mr);
  return true;
}

void raise_on_target(Node& node, const TargetQp& target, uint32_t detail) {
  node.notify(target.proc, target.pid, shm::Event{static_cast<uint32_t>(shm::EventKind::kQpAsync), target.qp->owner_qp_id, detail, 0});
}

// The responder QP detected an error: it moves to ERROR; its owner flushes it
// and reports `event` (IBV_EVENT_QP_ACCESS_ERR, QP_REQ_ERR, QP_FATAL).
void responder_error(Node& node, const TargetQp& target, ibv_event_type event) {
  uint32_t state = target.qp->state.load(std::memory_order_acquire);
  while (state != IBV_QPS_ERR && state != shm::SharedQp::kDestroyed && state != IBV_QPS_RESET) {
    if (target.qp->state.compare_exchange_weak(state, IBV_QPS_ERR, std::memory_order_acq_rel)) {
      raise_on_target(node, target, event);
      return;
    }
  }
}

void push_target_cqe(Node& node, const TargetQp& target, const shm::Cqe& cqe) {
  auto* cq = reinterpret_cast<shm::SharedCq*>(target.base + target.qp->recv_cq_offset);
  switch (cq->push(target.base, cqe)) {
    case shm::SharedCq::Push::kOk:
      return;
    case shm::SharedCq::Push::kOkNotify:
      node.notify(target.proc, target.pid, shm::Event{static_cast<uint32_t>(shm::EventKind::kCqNotify), cq->owner_cq_id, 0, 0});
      return;
    case shm::SharedCq::Push::kOverrun:
      node.notify(target.proc, target.pid, shm::Event{static_cast<uint32_t>(shm::EventKind::kCqError), cq->owner_cq_id, 0, 0});
      return;
  }
}

void mark_established(Node& node, const TargetQp& target) {
  if (target.qp->comm_established.load(std::memory_order_relaxed)) return;
  if (target.qp->comm_established.exchange(1, std::memory_order_acq_rel) == 0 &&
      target.qp->state.load(std::memory_order_acquire) == IBV_QPS_RTR)
    raise_on_target(node, target, IBV_EVENT_COMM_EST);
}

// A responder in a process that died answers nothing: no RNR NAK, no error
// NAK. Its segment stays mapped here, but the host registry reclaims its MRs
// whenever another process registers, so without this check a dead peer would
// show up as RNR forever (rnr_retry 7) or as a spurious REM_ACCESS_ERR. Only
// asked on those slow paths (it reads /proc). By pid: once the dead peer's
// registry slot is reclaimed, a new process may hold the same slot.
bool target_gone(Node& node, const TargetQp& target) {
  return target.proc != node.proc() && !node.registry().process_alive(target.proc, target.pid);
}

// The responder had no receive WQE: an RNR NAK, if anyone is there to send it.
ExecOutcome rnr_or_silence(Node& node, const TargetQp& target) {
  if (target_gone(node, target)) return no_response();
  return ExecOutcome{Kind::kRnr, IBV_WC_SUCCESS, rnr_timer_ns(target.qp->min_rnr_timer.load())};
}

shm::SharedRq* target_rq(const TargetQp& target) {
  const uint64_t offset = target.qp->srq_offset ? target.qp->srq_offset : target.qp->rq_offset;
  return reinterpret_cast<shm::SharedRq*>(target.base + offset);
}

struct RecvClaim {
  alignas(16) unsigned char storage[sizeof(shm::RecvWqe) + limits::kMaxSge * sizeof(shm::RecvSge)];
  shm::RecvWqe* wqe() { return reinterpret_cast<shm::RecvWqe*>(storage); }
};

bool take_recv(Node& node, const TargetQp& target, RecvClaim& claim) {
  shm::SharedRq* rq = target_rq(target);
  uint64_t remaining = 0;
  if (!rq->take(claim.wqe(), &remaining)) return false;
  uint32_t limit = rq->limit.load(std::memory_order_relaxed);
  if (limit != 0 && remaining < limit && rq->owner_srq_id != 0 &&
      rq->limit.compare_exchange_strong(limit, 0, std::memory_order_acq_rel))
    node.notify(target.proc, target.pid, shm::Event{static_cast<uint32_t>(shm::EventKind::kSrqLimit), rq->owner_srq_id, 0, 0});
  return true;
}

// Turns the claimed receive WQE's SGEs into iovecs in the target's memory.
// Returns LOC_PROT_ERR for a bad lkey, LOC_LEN_ERR if `needed` does not fit.
ibv_wc_status recv_iovecs(Node& node, const TargetQp& target, const shm::RecvWqe& wqe, uint64_t needed, iovec* out,
                          int* nout, KeysInUse* keys = nullptr) {
  const uint32_t pd_id = target.qp->srq_offset ? target_rq(target)->pd_id : target.qp->pd_id;
  uint64_t room = 0;
  int n = 0;
  for (uint32_t i = 0; i < wqe.num_sge && room < needed; ++i) {
    const shm::RecvSge& sge = wqe.sge[i];
    if (sge.length == 0) continue;
    host::MrRecord mr;
    if (!node.registry().lookup_mr(sge.lkey, mr) || mr.proc != target.proc || mr.pd_id != pd_id ||
        !(mr.access & IBV_ACCESS_LOCAL_WRITE) || sge.addr < mr.iova || sge.addr + sge.length > mr.iova + mr.length)
      return IBV_WC_LOC_PROT_ERR;
    uint64_t take = sge.length;
    if (take > needed - room) take = needed - room;
    out[n].iov_base = reinterpret_cast<void*>(mr.host_addr + (sge.addr - mr.iova));
    out[n].iov_len = take;
    ++n;
    room += take;
    if (keys) keys->add(mr);
  }
  *nout = n;
  return room < needed ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

shm::Cqe recv_cqe(const TargetQp& target, const shm::RecvWqe& wqe, ibv_wc_status status, uint32_t opcode,
                  uint32_t byte_len, uint32_t src_qp) {
  shm::Cqe cqe{};
  cqe.wr_id = wqe.wr_id;
  cqe.status = status;
  cqe.opcode = opcode;
  cqe.byte_len = byte_len;
  cqe.qp_num = target.qpn;
  cqe.src_qp = src_qp;
  return cqe;
}

// The 40 bytes a UD receiver finds before the payload: an IPv6 header, or for
// IPv4-mapped GIDs 20 zero bytes then an IPv4 header, as RoCEv2 HCAs write it.
void build_grh(unsigned char* grh, const uint8_t* sgid, const uint8_t* dgid, uint32_t payload, const AddressVector& av) {
  std::memset(grh, 0, limits::kUdGrhBytes);
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::memcmp(sgid, kMappedPrefix, 12) == 0 && std::memcmp(dgid, kMappedPrefix, 12) == 0;
  // UDP (8) + BTH (12) + DETH (8) + payload + ICRC (4): what the wire packet would carry.
  const uint32_t udp_len = 8 + 12 + 8 + payload + 4;
  if (v4) {
    unsigned char* ip = grh + 20;
    ip[0] = 0x45;
    ip[1] = av.traffic_class;
    const uint16_t total = htons(static_cast<uint16_t>(20 + udp_len));
    std::memcpy(ip + 2, &total, 2);
    ip[6] = 0x40;  // don't fragment
    ip[8] = av.hop_limit ? av.hop_limit : 64;
    ip[9] = 17;  // UDP
    std::memcpy(ip + 12, sgid + 12, 4);
    std::memcpy(ip + 16, dgid + 12, 4);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += (ip[i] << 8) | ip[i + 1];
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    const uint16_t check = htons(static_cast<uint16_t>(~sum));
    std::memcpy(ip + 10, &check, 2);
  } else {
    const uint32_t vtf = htonl((6u << 28) | (uint32_t{av.traffic_class} << 20) | (av.flow_label & 0xFFFFF));
    std::memcpy(grh, &vtf, 4);
    const uint16_t plen = htons(static_cast<uint16_t>(udp_len));
    std::memcpy(grh + 4, &plen, 2);
    grh[6] = 17;
    grh[7] = av.hop_limit ? av.hop_limit : 64;
    std::memcpy(grh + 8, sgid, 16);
    std::memcpy(grh + 24, dgid, 16);
  }
}

// A multicast GID: ff00::/8, or the IPv4-mapped form of 224.0.0.0/4 that
// RoCE uses for IPv4 groups (the kernel's rdma_is_multicast_addr).
bool is_multicast_gid(const uint8_t* gid) {
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (gid[0] == 0xff) return true;
  return std::memcmp(gid, kMappedPrefix, 12) == 0 && (gid[12] & 0xF0) == 0xE0;
}

// Delivers one UD message to QP `qpn` on this host, or drops it silently as UD allows.
void deliver_ud(QueuePair& qp, const SendWqe& wqe, const iovec* src, int nsrc, uint64_t length, uint32_t qpn) {
  Node& node = qp.node();
  const AddressVector& av = wqe.ah->av();
  TargetQp target;
  if (!resolve(node, qpn, target)) return;
  TargetUse use(target.qp);
  MemoryAccess access(node, target.proc);
  const uint32_t state = target.qp->state.load(std::memory_order_acquire);
  if (target.qp->qp_type != IBV_QPT_UD || state >= 32 || !((1u << state) & kReceivableStates)) return;
  const uint32_t qkey = (wqe.remote_qkey & 0x80000000u) ? qp.attrs().qkey : wqe.remote_qkey;
  if (qkey != target.qp->qkey.load(std::memory_order_acquire)) return;
  RecvClaim claim;
  if (!take_recv(node, target, claim)) return;
  const shm::RecvWqe& rwqe = *claim.wqe();
  const uint64_t needed = limits::kUdGrhBytes + length;
  iovec dst[limits::kMaxSge];
  int ndst = 0;
  ibv_wc_status rstatus = recv_iovecs(node, target, rwqe, needed, dst, &ndst);
  if (rstatus == IBV_WC_SUCCESS) {
    const GidEntry* sgid = device_info().gid_at(av.sgid_index);
    unsigned char grh[limits::kUdGrhBytes];
    static constexpr uint8_t kZero[16] = {};
    build_grh(grh, sgid ? sgid->raw.data() : kZero, av.dgid, static_cast<uint32_t>(length), av);
    iovec all[limits::kMaxSge + 1];
    all[0] = {grh, sizeof grh};
    for (int i = 0; i < nsrc; ++i) all[i + 1] = src[i];
    const shm::CopyResult copied = shm::write_to(target.pid, dst, ndst, all, nsrc + 1, needed);
    if (copied != shm::CopyResult::kOk) rstatus = IBV_WC_LOC_PROT_ERR;
  }
  const bool with_imm = wqe.opcode == IBV_WR_SEND_WITH_IMM;
  shm::Cqe cqe = recv_cqe(target, rwqe, rstatus, IBV_WC_RECV, static_cast<uint32_t>(needed), qp.qpn());
  cqe.wc_flags = IBV_WC_GRH | (with_imm ? IBV_WC_WITH_IMM : 0);
  cqe.imm_data = with_imm ? wqe.imm_data : 0;
  cqe.sl = av.sl;
  cqe.solicited = (wqe.send_flags & IBV_SEND_SOLICITED) ? 1 : 0;
  push_target_cqe(node, target, cqe);
}

ExecOutcome execute_ud(QueuePair& qp, SendWqe& wqe, const iovec* src, int nsrc, uint64_t length) {
  if (length > limits::kMtuBytes) return done(IBV_WC_LOC_LEN_ERR);
  const AddressVector& av = wqe.ah->av();
  if (av.is_global && wqe.remote_qpn == kMulticastQpn && is_multicast_gid(av.dgid)) {
    // Multicast: a copy to every QP attached to the group on this host, the
    // sender's own QP included when it is attached (multicast loopback, as
    // rxe and mlx5 do and mckey expects) unless it was created with
    // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB. Nothing leaves the host.
    uint32_t members[host::kMaxMcastMembers];
    const uint32_t n = qp.node().registry().mcast_members(av.dgid, members);
    const bool skip_self = qp.init_attr().block_self_multicast;
    for (uint32_t i = 0; i < n; ++i)
      if (!skip_self || members[i] != qp.qpn()) deliver_ud(qp, wqe, src, nsrc, length, members[i]);
    return done(IBV_WC_SUCCESS);
  }
  // Without a GRH, or to a GID that is not on this host, the message leaves
  // for a network softhca does not reach yet: it is lost, as UD allows.
  if (!av.is_global || !is_local_gid(std::span<const uint8_t, 16>(av.dgid, 16))) return done(IBV_WC_SUCCESS);
  deliver_ud(qp, wqe, src, nsrc, length, wqe.remote_qpn);
  return done(IBV_WC_SUCCESS);
}

// An atomic on the target's memory: one 8-byte read-modify-write under the
// host's stripe lock for that address (IBV_ATOMIC_HCA: atomic against every
// other atomic issued through softhca on this host).
bool remote_atomic(Node& node, const TargetQp& target, const iovec& where, const SendWqe& wqe, uint64_t* original) {
  if (wqe.opcode == IBV_WR_ATOMIC_WRITE) {
    // RDMA ATOMIC WRITE: the 8 bytes land whole, under the same lock as the
    // read-modify-write atomics, so neither sees half of the other.
    host::AtomicStripe& stripe = node.registry().atomic_stripe(target.pid, reinterpret_cast<uint64_t>(where.iov_base));
    while (stripe.locked.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
    uint64_t value = wqe.compare_add;
    iovec local{&value, sizeof value};
    const bool ok = shm::write_to(target.pid, &where, 1, &local, 1, sizeof value) == shm::CopyResult::kOk;
    stripe.locked.store(0, std::memory_order_release);
    *original = 0;
    return ok;
  }
  host::AtomicStripe& stripe = node.registry().atomic_stripe(target.pid, reinterpret_cast<uint64_t>(where.iov_base));
  while (stripe.locked.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
  uint64_t value = 0;
  iovec local{&value, sizeof value};
  bool ok = shm::read_from(target.pid, &local, 1, &where, 1, sizeof value) == shm::CopyResult::kOk;
  if (ok) {
    *original = value;
    uint64_t next = value;
    if (wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      next = value + wqe.compare_add;
    } else if (value == wqe.compare_add) {
      next = wqe.swap;
    }
    if (next != value) {
      local.iov_base = &next;
      ok = shm::write_to(target.pid, &where, 1, &local, 1, sizeof next) == shm::CopyResult::kOk;
    }
  }
  stripe.locked.store(0, std::memory_order_release);
  return ok;
}

}  // namespace

uint64_t rnr_timer_ns(uint32_t code) {
  // IBTA table 45, in units of 10 us.
  static constexpr uint32_t kTensOfMicros[32] = {65536, 1,   2,   3,   4,   6,    8,    12,   16,   24,   32,
                                                  48,    64,  96,  128, 192, 256,  384,  512,  768,  1024, 1536,
                                                  2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return uint64_t{kTensOfMicros[code & 31]} * 10'000;
}

uint64_t ack_timeout_ns(uint32_t code) {
  if (code == 0) return 0;
  return 4096ULL << (code & 31);
}

uint64_t peer_incarnation_of(Node& node, uint32_t qpn) {
  TargetQp target;
  if (!resolve(node, qpn, target)) return 0;
  return target.qp->incarnation.load(std::memory_order_relaxed);
}

ExecOutcome shm_execute(QueuePair& qp, SendWqe& wqe) {
  Node& node = qp.node();
  const uint32_t pd_id = qp.pd().id();
  const bool is_read = wqe.opcode == IBV_WR_RDMA_READ;
  const bool is_atomic = wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

  // The local side: inline data, or SGEs checked against our MRs (an atomic
  // write's value sits in the WQE itself).
  iovec src[limits::kMaxSge + 1];
  int nsrc = 0;
  uint64_t length = 0;
  if (wqe.opcode == IBV_WR_ATOMIC_WRITE) {
    src[0] = {&wqe.compare_add, sizeof wqe.compare_add};
    nsrc = 1;
    length = sizeof wqe.compare_add;
  } else if (wqe.send_flags & IBV_SEND_INLINE) {
    src[0] = {wqe.inline_data(qp.init_attr().max_send_sge), wqe.inline_len};
    nsrc = wqe.inline_len ? 1 : 0;
    length = wqe.inline_len;
  } else {
    const uint32_t access = (is_read || is_atomic) ? IBV_ACCESS_LOCAL_WRITE : 0;
    const ibv_wc_status local = local_iovecs(node, pd_id, wqe.sge, wqe.num_sge, access, src, &nsrc, &length);
    if (local != IBV_WC_SUCCESS) return done(local);
  }
  if (length > limits::kMaxMsgSize) return done(IBV_WC_LOC_LEN_ERR);
  if (is_atomic && length != 8) return done(IBV_WC_LOC_LEN_ERR);
  wqe.length = length;

  if (qp.type() == IBV_QPT_UD) return execute_ud(qp, wqe, src, nsrc, length);

  // RC and UC: the connected QP.
  const bool reliable = qp.type() == IBV_QPT_RC;
  TargetQp& target = qp.connected_target();
  const uint32_t dest_qpn = qp.attrs().dest_qpn;
  if (target.qp == nullptr || target.qp->qpn != dest_qpn ||
      target.qp->state.load(std::memory_order_acquire) == shm::SharedQp::kDestroyed) {
    target = TargetQp{};
    if (!resolve(node, dest_qpn, target)) {
      target = TargetQp{};
      return reliable ? no_response() : done(IBV_WC_SUCCESS);
    }
  }
  TargetUse use(target.qp);
  // A QP that took over the QPN of the one we were connected to is not our
  // peer: like a responder that drops packets of a PSN it does not expect, it
  // answers nothing, and the requester ends in RETRY_EXC_ERR.
  const uint64_t incarnation = target.qp->incarnation.load(std::memory_order_relaxed);
  if (qp.peer_incarnation() == 0) {
    qp.bind_peer(incarnation);
  } else if (incarnation != qp.peer_incarnation()) {
    return reliable ? no_response() : done(IBV_WC_SUCCESS);
  }
  MemoryAccess access(node, target.proc);
  const uint32_t state = target.qp->state.load(std::memory_order_acquire);
  if (state >= 32 || !((1u << state) & kReceivableStates) || target.qp->qp_type != static_cast<uint32_t>(qp.type()))
    return reliable ? no_response() : done(IBV_WC_SUCCESS);

  // A responder error: RC reports it to both sides; UC drops the message.
  auto responder_fails = [&](ibv_wc_status requester_status, ibv_event_type event) {
    if (!reliable) return done(IBV_WC_SUCCESS);
    if (target_gone(node, target)) return no_response();
    responder_error(node, target, event);
    return done(requester_status);
  };

  switch (wqe.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      iovec dst;
      KeysInUse keys;
      if (!remote_range(node, target, wqe.rkey, wqe.remote_addr, length, IBV_ACCESS_REMOTE_WRITE, &dst, &keys))
        return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      RecvClaim claim;
      const bool with_imm = wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
      if (with_imm && !take_recv(node, target, claim)) {
        if (!reliable) return done(IBV_WC_SUCCESS);
        return rnr_or_silence(node, target);
      }
      // A deregistration of the target MR mid-copy stops it: REM_ACCESS_ERR.
      const shm::CopyResult copied = fenced_write(node, target, &dst, 1, src, nsrc, length, keys);
      if (copied == shm::CopyResult::kGone) return reliable ? no_response() : done(IBV_WC_SUCCESS);
      if (copied != shm::CopyResult::kOk) return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      mark_established(node, target);
      if (with_imm) {
        shm::Cqe cqe = recv_cqe(target, *claim.wqe(), IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
                                static_cast<uint32_t>(length), qp.qpn());
        cqe.wc_flags = IBV_WC_WITH_IMM;
        cqe.imm_data = wqe.imm_data;
        cqe.solicited = (wqe.send_flags & IBV_SEND_SOLICITED) ? 1 : 0;
        push_target_cqe(node, target, cqe);
      }
      return done(IBV_WC_SUCCESS);
    }
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: {
      RecvClaim claim;
      if (!take_recv(node, target, claim)) {
        if (!reliable) return done(IBV_WC_SUCCESS);
        return rnr_or_silence(node, target);
      }
      const shm::RecvWqe& rwqe = *claim.wqe();
      iovec dst[limits::kMaxSge];
      int ndst = 0;
      KeysInUse keys;
      ibv_wc_status rstatus = recv_iovecs(node, target, rwqe, length, dst, &ndst, &keys);
      if (rstatus == IBV_WC_SUCCESS) {
        const shm::CopyResult copied = fenced_write(node, target, dst, ndst, src, nsrc, length, keys);
        if (copied == shm::CopyResult::kGone) return reliable ? no_response() : done(IBV_WC_SUCCESS);
        if (copied != shm::CopyResult::kOk) rstatus = IBV_WC_LOC_PROT_ERR;
      }
      const bool with_imm = wqe.opcode == IBV_WR_SEND_WITH_IMM;
      shm::Cqe cqe = recv_cqe(target, rwqe, rstatus, IBV_WC_RECV, static_cast<uint32_t>(length), qp.qpn());
      cqe.wc_flags = with_imm ? IBV_WC_WITH_IMM : 0;
      cqe.imm_data = with_imm ? wqe.imm_data : 0;
      cqe.solicited = (wqe.send_flags & IBV_SEND_SOLICITED) ? 1 : 0;
      if (rstatus != IBV_WC_SUCCESS) {
        // The receive WQE completes in error at the responder, whose QP goes to
        // ERROR; an RC requester learns it from the NAK (invalid request for a
        // length error, remote operational error for a protection error).
        if (!reliable) return done(IBV_WC_SUCCESS);  // UC: the message is dropped
        if (target_gone(node, target)) return no_response();
        push_target_cqe(node, target, cqe);
        responder_error(node, target, IBV_EVENT_QP_FATAL);
        return done(rstatus == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
      }
      mark_established(node, target);
      push_target_cqe(node, target, cqe);
      return done(IBV_WC_SUCCESS);
    }
    case IBV_WR_RDMA_READ: {
      if (target.qp->max_dest_rd_atomic.load() == 0)
        return responder_fails(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
      iovec from;
      KeysInUse keys;
      if (!remote_range(node, target, wqe.rkey, wqe.remote_addr, length, IBV_ACCESS_REMOTE_READ, &from, &keys))
        return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      const shm::CopyResult copied = fenced_read(node, target, src, nsrc, &from, 1, length, keys);
      if (copied == shm::CopyResult::kGone) return no_response();
      if (copied != shm::CopyResult::kOk) return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      mark_established(node, target);
      return done(IBV_WC_SUCCESS);
    }
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      if (target.qp->max_dest_rd_atomic.load() == 0)
        return responder_fails(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
      if (wqe.remote_addr & 7) return responder_fails(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
      iovec where;
      if (!remote_range(node, target, wqe.rkey, wqe.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC, &where))
        return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      uint64_t original = 0;
      if (!remote_atomic(node, target, where, wqe, &original)) return no_response();
      iovec value{&original, sizeof original};
      shm::copy_iovecs(src, nsrc, &value, 1, sizeof original);
      mark_established(node, target);
      return done(IBV_WC_SUCCESS);
    }
    case IBV_WR_ATOMIC_WRITE: {
      // Like an RDMA WRITE of 8 bytes (remote write access), aligned as an atomic.
      if (wqe.remote_addr & 7) return responder_fails(IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
      iovec where;
      if (!remote_range(node, target, wqe.rkey, wqe.remote_addr, 8, IBV_ACCESS_REMOTE_WRITE, &where))
        return responder_fails(IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
      uint64_t unused = 0;
      if (!remote_atomic(node, target, where, wqe, &unused)) return no_response();
      mark_established(node, target);
      return done(IBV_WC_SUCCESS);
    }
    default:
      return done(IBV_WC_LOC_QP_OP_ERR);
  }
}

}  // namespace softhca::engine
