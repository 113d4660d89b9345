#include "link/shm/shm_port.hpp"

#include "host/memory_check.hpp"
#include "host/process_identity.hpp"
#include "link/registered_key.hpp"
#include "link/shm/remote_memory.hpp"
#include "transport/tag_matching.hpp"

namespace softhca::shm {
namespace {

transport::CopyStatus status_of(CopyResult r) {
  switch (r) {
    case CopyResult::kOk:
      return transport::CopyStatus::kOk;
    case CopyResult::kFault:
      return transport::CopyStatus::kFault;
    case CopyResult::kGone:
      return transport::CopyStatus::kGone;
  }
  return transport::CopyStatus::kFault;
}

}  // namespace

bool ShmResponderPort::KeysInUse::still_valid(host::HostRegistry& registry) const {
  for (int i = 0; i < n_; ++i) {
    host::MrRecord now;
    const host::MrRecord& then = records_[i];
    if (!registry.lookup_mr(then.key, now) || now.proc != then.proc || now.pd_id != then.pd_id ||
        now.access != then.access || now.iova != then.iova || now.length != then.length ||
        now.host_addr != then.host_addr || now.shared != then.shared)
      return false;
  }
  return true;
}

bool ShmResponderPort::KeysInUse::any_on_demand() const {
  for (int i = 0; i < n_; ++i)
    if (records_[i].access & IBV_ACCESS_ON_DEMAND) return true;
  return false;
}

bool ShmResponderPort::own_ranges_mapped(const TargetQp& owner, const iovec* ranges, int n, bool written) {
  if (owner.proc != host_.proc() || !keys_.any_on_demand()) return true;
  for (int i = 0; i < n; ++i)
    if (ranges[i].iov_len != 0 &&
        !host::check_process_range(ranges[i].iov_base, ranges[i].iov_len,
                                   written ? host::MemoryNeed::kWrite : host::MemoryNeed::kRead))
      return false;
  return true;
}

const host::MrRecord* ShmResponderPort::KeysInUse::holding(uint32_t proc, uint64_t addr, uint64_t length) const {
  for (int i = 0; i < n_; ++i) {
    const host::MrRecord& r = records_[i];
    if (r.proc == proc && addr >= r.host_addr && length <= r.length && addr - r.host_addr <= r.length - length)
      return &r;
  }
  return nullptr;
}

TargetQp* ShmResponderPort::owner_of(const iovec& range, iovec& untagged) {
  const uint64_t addr = reinterpret_cast<uint64_t>(range.iov_base);
  untagged = iovec{reinterpret_cast<void*>(addr & ~kOtherProcess), range.iov_len};
  return (addr & kOtherProcess) == 0 ? data_ : memory_;  // (nullptr: no such key was given)
}

bool ShmResponderPort::local_views(TargetQp& owner, const iovec* target, int n, iovec* local) {
  // Our own registered memory too goes through our window onto its file, not
  // through the address the application registered: as a NIC writes into
  // the pages an MR pinned, a WRITE must land even where the application
  // has since unmapped that address (it crashed the process before, over
  // the udp link and between QPs of one process).
  // A dead owner's file is still mapped here, so a copy into it would
  // succeed: only a live owner's memory is reached this way. (Else the
  // process_vm path answers ESRCH and the operation is lost, as with a NIC
  // whose peer went away.)
  if (owner.base == nullptr || !reinterpret_cast<const host::SegmentHeader*>(owner.base)->owner_running())
    return false;
  for (int i = 0; i < n; ++i) {
    const uint64_t addr = reinterpret_cast<uint64_t>(target[i].iov_base);
    const host::MrRecord* mr = keys_.holding(owner.proc, addr, target[i].iov_len);
    // Only whole pages are in the file: a range reaching a partial page at
    // the MR's ends is copied, all of it.
    if (mr == nullptr) return false;
    host::PeerBackings::View window{owner.backing, owner.backing_length};
    char* at = host_.in_backing(owner.proc, mr->shared, addr, target[i].iov_len, window);
    if (at == nullptr) return false;
    owner.backing = window.base;
    owner.backing_length = window.length;
    local[i] = iovec{at, target[i].iov_len};
  }
  return true;
}

transport::ResponderQp ShmResponderPort::qp() {
  const host::SharedQp& s = *target_.qp;
  transport::ResponderQp v;
  v.type = s.qp_type;
  v.state = s.state.load(std::memory_order_acquire);
  v.access = s.access.load(std::memory_order_acquire);
  v.pd_id = s.pd_id;
  v.receive_pd_id = s.srq_offset ? receive_queue()->pd_id : s.pd_id;
  v.qkey = s.qkey.load(std::memory_order_acquire);
  v.min_rnr_timer = s.min_rnr_timer.load(std::memory_order_relaxed);
  v.max_dest_rd_atomic = s.max_dest_rd_atomic.load(std::memory_order_relaxed);
  v.qpn = target_.qpn;
  return v;
}

// A key of the message's memory. Besides the QP's (or its XRC SRQ's)
// process, the keys may name MRs of one other process in the same PD (a PD
// that processes share through an imported context): announced at its
// first key, before that key is read again.
std::optional<transport::MemoryKey> ShmResponderPort::memory_key(uint32_t key) {
  host::MrRecord mr;
  if (key_cache_ != nullptr) {
    if (!host_.registry().lookup_mr_cached(key, *key_cache_)) return std::nullopt;
    mr = key_cache_->record;
  } else if (!host_.registry().lookup_mr(key, mr)) {
    return std::nullopt;
  }
  if (mr.proc != data_->proc && (memory_ == nullptr || mr.proc != memory_->proc) && !adopt_memory_process(key, mr))
    return std::nullopt;
  keys_.add(mr);
  // The other process's addresses are tagged (see kOtherProcess).
  const uint64_t host_addr = mr.proc == data_->proc ? mr.host_addr : mr.host_addr | kOtherProcess;
  return link::registered_key(mr, host_addr);
}

bool ShmResponderPort::adopt_memory_process(uint32_t key, host::MrRecord& mr) {
  if (memory_ != nullptr || mr.kind != host::kKeyRegion) return false;
  char* base = host_.segment_base(mr.proc);
  const uint32_t pid = host_.pid_of(mr.proc);
  if (base == nullptr || pid == 0) return false;
  if (mr.proc != target_.proc && mr.proc != data_->proc) {
    // Without waiting: this thread holds a slot already (a few tries, for
    // the moments when every slot of this process is taken).
    for (int i = 0; i < 64 && memory_access_ == host::HostRegistry::kNoAccessSlot; ++i)
      memory_access_ = host_.registry().try_begin_access(host_.proc(), mr.proc);
    if (memory_access_ == host::HostRegistry::kNoAccessSlot) return false;
  }
  // Read again under the announcement: a deregistration now waits for us.
  host::MrRecord again;
  if (!host_.registry().lookup_mr(key, again) || again.proc != mr.proc || host_.pid_of(mr.proc) != pid) return false;
  mr = again;
  TargetQp& owner = memory_owner_.emplace();
  owner.base = base;
  owner.pid = pid;
  owner.proc = mr.proc;
  memory_ = &owner;
  return true;
}

bool ShmResponderPort::invalidate(uint32_t rkey) {
  // The owner's registry entry changes here, in whichever process runs the
  // responder; the owner's poll of the completion fences the accesses that
  // may have validated the key before (CompletionQueue::poll).
  // (An XRC message's window is in its SRQ's process and PD.)
  const uint32_t pd_id = xrc_srq_ != nullptr ? xrc_srq_->pd_id : target_.qp->pd_id;
  return host_.registry().invalidate_window(rkey, data_->proc, pd_id).has_value();
}

// The SRQ must be published under `srqn` now and belong to the QP's domain;
// it may live in any process of the host (an XRC domain is shared by file).
// Its record is read under an access to its process: an SRQ being destroyed
// releases its number and then waits out that fence, as a QP does.
std::optional<uint32_t> ShmResponderPort::select_xrc_srq(uint32_t srqn) {
  if (xrc_srq_ != nullptr) {
    if (srqn == xrc_srqn_) return xrc_srq_->pd_id;  // bound already (the udp link binds each packet first)
    return std::nullopt;
  }
  if (srqn == 0 || target_.qp->qp_type != IBV_QPT_XRC_RECV || !resolve(host_, srqn, xrc_owner_)) return std::nullopt;
  // An earlier try on this port (the udp link binds a packet to its SRQ,
  // then the responder asks again) announced a process: one at a time.
  if (xrc_access_ != host::HostRegistry::kNoAccessSlot) {
    host_.registry().end_access(host_.proc(), xrc_access_);
    xrc_access_ = host::HostRegistry::kNoAccessSlot;
  }
  if (xrc_owner_.proc != target_.proc) {
    // The SRQ's process too must be announced before its record is read
    // (a TGT QP's own announcement names the host, kHostOwned); without
    // waiting, since this thread already holds a slot (no free one: the
    // message is not taken now, and the requester sends it again).
    xrc_access_ = host_.registry().try_begin_access(host_.proc(), xrc_owner_.proc);
    if (xrc_access_ == host::HostRegistry::kNoAccessSlot) return std::nullopt;
  }
  if (!still_there(xrc_owner_)) return std::nullopt;
  const host::SharedQp& record = *xrc_owner_.qp;
  if (record.qp_type != host::SharedQp::kXrcSrqRecord || record.xrcd_id == 0 ||
      record.xrcd_id != target_.qp->xrcd_id)
    return std::nullopt;
  xrc_srq_ = &record;
  xrc_srqn_ = srqn;
  data_ = &xrc_owner_;
  return record.pd_id;
}

ShmResponderPort::~ShmResponderPort() {
  if (xrc_access_ != host::HostRegistry::kNoAccessSlot) host_.registry().end_access(host_.proc(), xrc_access_);
  if (memory_access_ != host::HostRegistry::kNoAccessSlot) host_.registry().end_access(host_.proc(), memory_access_);
}

host::SharedRq* ShmResponderPort::receive_queue() const {
  if (xrc_srq_ != nullptr) return reinterpret_cast<host::SharedRq*>(xrc_owner_.base + xrc_srq_->srq_offset);
  const uint64_t offset = target_.qp->srq_offset ? target_.qp->srq_offset : target_.qp->rq_offset;
  return reinterpret_cast<host::SharedRq*>(target_.base + offset);
}

bool ShmResponderPort::take_receive(transport::ReceiveWqe& out) {
  // An XRC TGT QP has no queue of its own: only the SRQ a message named.
  if (target_.qp->qp_type == IBV_QPT_XRC_RECV && xrc_srq_ == nullptr) return false;
  static_assert(sizeof(host::RecvSge) == sizeof(transport::ReceiveSge));
  alignas(16) unsigned char storage[sizeof(host::RecvWqe) + limits::kMaxSge * sizeof(host::RecvSge)];
  auto* wqe = reinterpret_cast<host::RecvWqe*>(storage);
  host::SharedRq* rq = receive_queue();
  uint64_t remaining = 0;
  if (!rq->take(wqe, &remaining)) return false;
  out.wr_id = wqe->wr_id;
  out.num_sge = wqe->num_sge < limits::kMaxSge ? wqe->num_sge : limits::kMaxSge;
  for (uint32_t i = 0; i < out.num_sge; ++i)
    out.sge[i] = transport::ReceiveSge{wqe->sge[i].addr, wqe->sge[i].length, wqe->sge[i].lkey};
  // An SRQ that drops below its armed limit tells its owner, once.
  uint32_t limit = rq->limit.load(std::memory_order_relaxed);
  if (limit != 0 && remaining < limit && rq->owner_srq_id != 0 &&
      rq->limit.compare_exchange_strong(limit, 0, std::memory_order_acq_rel))
    host_.notify(data_->proc, data_->pid,
                 host::Event{static_cast<uint32_t>(host::EventKind::kSrqLimit), rq->owner_srq_id, 0, rq->owner_serial});
  return true;
}

transport::CopyStatus ShmResponderPort::copy_owned(TargetQp& data, bool into_target, const iovec* to, int nto,
                                                   const iovec* from, int nfrom, uint64_t length) {
  // The owner's side seen here: plain copies, no system call.
  iovec view[limits::kMaxSge + 1];
  const iovec* owner = into_target ? to : from;
  const int nowner = into_target ? nto : nfrom;
  if (!own_ranges_mapped(data, owner, nowner, into_target)) return transport::CopyStatus::kFault;
  const bool local = nowner <= limits::kMaxSge + 1 && local_views(data, owner, nowner, view);
  if (local) {
    if (into_target) to = view;
    else from = view;
  }
  auto copy = [&](const iovec* t, int nt, const iovec* f, int nf, uint64_t bytes) {
    if (local) {
      copy_iovecs(t, nt, f, nf, bytes);
      return CopyResult::kOk;
    }
    return (into_target ? write_to : read_from)(data.pid, t, nt, f, nf, bytes);
  };
  if (length <= kFenceChunk) return status_of(copy(to, nto, from, nfrom, length));
  iovec to_part[limits::kMaxSge + 1], from_part[limits::kMaxSge + 1];
  for (uint64_t offset = 0; offset < length; offset += kFenceChunk) {
    // A deregistration of a key under the copy stops it between chunks.
    if (offset != 0 && !keys_.still_valid(host_.registry())) return transport::CopyStatus::kFault;
    // Through the owner's file: stop once the owner is gone (its window may
    // be unmapped a while later).
    if (local && offset != 0 && !reinterpret_cast<const host::SegmentHeader*>(data.base)->owner_running())
      return transport::CopyStatus::kGone;
    const uint64_t bytes = length - offset < kFenceChunk ? length - offset : kFenceChunk;
    const int nt = slice_iovecs(to, nto, offset, bytes, to_part);
    const int nf = slice_iovecs(from, nfrom, offset, bytes, from_part);
    const CopyResult r = copy(to_part, nt, from_part, nf, bytes);
    if (r != CopyResult::kOk) return status_of(r);
  }
  return transport::CopyStatus::kOk;
}

// The memory of one process, the common case, or, when a message's keys
// name MRs of two processes (a receive WQE with SGEs in this process's
// memory and in memory imported from another), each range with its own.
transport::CopyStatus ShmResponderPort::fenced_copy(bool into_target, const iovec* to, int nto, const iovec* from,
                                                    int nfrom, uint64_t length) {
  if (memory_ == nullptr) [[likely]]
    return copy_owned(*data_, into_target, to, nto, from, nfrom, length);
  return copy_two_processes(into_target, to, nto, from, nfrom, length);
}

transport::CopyStatus ShmResponderPort::copy_two_processes(bool into_target, const iovec* to, int nto,
                                                           const iovec* from, int nfrom, uint64_t length) {
  const iovec* tagged = into_target ? to : from;
  const int nowner = into_target ? nto : nfrom;
  iovec owner[limits::kMaxSge + 1];
  TargetQp* owners[limits::kMaxSge + 1] = {data_};
  if (nowner > limits::kMaxSge + 1) return transport::CopyStatus::kFault;
  bool mixed = false;
  for (int i = 0; i < nowner; ++i) {
    owners[i] = owner_of(tagged[i], owner[i]);
    if (owners[i] == nullptr) return transport::CopyStatus::kFault;
    mixed |= owners[i] != owners[0];
  }
  if (!mixed)
    return into_target ? copy_owned(*owners[0], true, owner, nowner, from, nfrom, length)
                       : copy_owned(*owners[0], false, to, nto, owner, nowner, length);
  const iovec* other = into_target ? from : to;
  const int nother = into_target ? nfrom : nto;
  uint64_t offset = 0;
  for (int i = 0; i < nowner && offset < length; ++i) {
    const uint64_t bytes = owner[i].iov_len < length - offset ? owner[i].iov_len : length - offset;
    if (bytes == 0) continue;
    iovec part[limits::kMaxSge + 1];
    const int nparts = slice_iovecs(other, nother, offset, bytes, part);
    const iovec mine{owner[i].iov_base, static_cast<size_t>(bytes)};
    const transport::CopyStatus status = into_target ? copy_owned(*owners[i], true, &mine, 1, part, nparts, bytes)
                                                     : copy_owned(*owners[i], false, part, nparts, &mine, 1, bytes);
    if (status != transport::CopyStatus::kOk) return status;
    offset += bytes;
  }
  return transport::CopyStatus::kOk;
}

transport::CopyStatus ShmResponderPort::write(const iovec* to, int nto, const iovec* from, int nfrom,
                                              uint64_t length) {
  return fenced_copy(true, to, nto, from, nfrom, length);
}

transport::CopyStatus ShmResponderPort::read(const iovec* to, int nto, const iovec* from, int nfrom,
                                             uint64_t length) {
  return fenced_copy(false, to, nto, from, nfrom, length);
}

// Under the host's stripe lock for the word's address (IBV_ATOMIC_HCA: atomic
// against every other atomic issued through softhca on this host), one
// 8-byte read-modify-write, or for ATOMIC WRITE one 8-byte store that neither
// side sees half of.
transport::CopyStatus ShmResponderPort::atomic(void* word, transport::AtomicOp op, uint64_t compare_add,
                                               uint64_t swap, uint64_t& original) {
  iovec where{word, sizeof(uint64_t)};
  TargetQp* found = data_;
  if (memory_ != nullptr) [[unlikely]] {
    found = owner_of(iovec{word, sizeof(uint64_t)}, where);
    if (found == nullptr) return transport::CopyStatus::kFault;
    word = where.iov_base;
  }
  TargetQp& owner = *found;
  if (!own_ranges_mapped(owner, &where, 1, true)) return transport::CopyStatus::kFault;
  iovec view;
  const bool local = local_views(owner, &where, 1, &view);
  host::AtomicStripe& stripe = host_.registry().atomic_stripe(owner.pid, reinterpret_cast<uint64_t>(word));
  while (stripe.locked.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
  CopyResult r = CopyResult::kOk;
  original = 0;
  if (local) {
    // The word itself, shared: one CPU atomic (the owner's own stores to it
    // are then never half-seen), still under the stripe for IBV_ATOMIC_HCA.
    auto* shared = static_cast<uint64_t*>(view.iov_base);
    if (op == transport::AtomicOp::kWrite) {
      __atomic_store_n(shared, compare_add, __ATOMIC_SEQ_CST);
    } else if (op == transport::AtomicOp::kFetchAdd) {
      original = __atomic_fetch_add(shared, compare_add, __ATOMIC_SEQ_CST);
    } else {
      original = compare_add;
      __atomic_compare_exchange_n(shared, &original, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
  } else if (op == transport::AtomicOp::kWrite) {
    uint64_t value = compare_add;
    const iovec local_word{&value, sizeof value};
    r = write_to(owner.pid, &where, 1, &local_word, 1, sizeof value);
  } else {
    uint64_t value = 0;
    iovec local_word{&value, sizeof value};
    r = read_from(owner.pid, &local_word, 1, &where, 1, sizeof value);
    if (r == CopyResult::kOk) {
      original = value;
      uint64_t next = value;
      if (op == transport::AtomicOp::kFetchAdd) {
        next = value + compare_add;
      } else if (value == compare_add) {
        next = swap;
      }
      if (next != value) {
        local_word.iov_base = &next;
        r = write_to(owner.pid, &where, 1, &local_word, 1, sizeof next);
      }
    }
  }
  stripe.locked.store(0, std::memory_order_release);
  return status_of(r);
}

void ShmResponderPort::complete_receive(const transport::ReceiveCompletion& c) {
  push_receive_to(host_, target_, *data_, xrc_srq_, c, nullptr, false);
}

void ShmResponderPort::complete_direct_receive(host::Attachment& host, const TargetQp& target,
                                               const transport::ReceiveCompletion& c, const uint64_t* position) {
  push_receive_to(host, target, target, nullptr, c, position, true);
}

void ShmResponderPort::push_receive_to(host::Attachment& host, const TargetQp& target, const TargetQp& owner,
                                       const host::SharedQp* xrc_srq, const transport::ReceiveCompletion& c,
                                       const uint64_t* position, bool announced) {
  // ... and no CQ: a completion without its SRQ has nowhere to go.
  if (target.qp->qp_type == IBV_QPT_XRC_RECV && xrc_srq == nullptr) return;
  if (c.status == IBV_WC_SUCCESS) {
    target.qp->counters.add(Counter::kRdmaRecvs);
    host.registry().process_counters(owner.proc).add(Counter::kRdmaRecvs);
  }
  host::Cqe cqe = receive_cqe(target, c, position);
  uint64_t cq_offset = target.qp->recv_cq_offset;
  if (xrc_srq != nullptr) {
    cq_offset = xrc_srq->recv_cq_offset;
    cqe.flags = host::kCqeXrcSrq;
    cqe.vendor_err = xrc_srq->owner_qp_id;
  }
  // The CQ lives with the receive queue: an XRC SRQ's in the SRQ's process.
  auto* cq = reinterpret_cast<host::SharedCq*>(owner.base + cq_offset);
  notify_receive_cq(host, owner, *cq, announced ? cq->push_announced(owner.base, cqe) : cq->push(owner.base, cqe));
}

void ShmResponderPort::notify_receive_cq(host::Attachment& host, const TargetQp& owner, const host::SharedCq& cq,
                                         host::SharedCq::Push pushed) {
  switch (pushed) {
    case host::SharedCq::Push::kOk:
      return;
    case host::SharedCq::Push::kOkNotify:
      host.notify(owner.proc, owner.pid,
                  host::Event{static_cast<uint32_t>(host::EventKind::kCqNotify), cq.owner_cq_id, 0, cq.owner_serial});
      return;
    case host::SharedCq::Push::kOverrun:
      host.notify(owner.proc, owner.pid,
                  host::Event{static_cast<uint32_t>(host::EventKind::kCqError), cq.owner_cq_id, 0, cq.owner_serial});
      return;
  }
}

// The list's owner, or another sender, may have been killed holding it.
transport::LockTaker ShmResponderPort::tag_list_taker() { return {host::self_pid(), &host::pid_alive}; }

// The SRQ of an RC QP may be a tag matching one (never an XRC SRQ).
transport::TagList* ShmResponderPort::tag_list() {
  if (xrc_srq_ != nullptr || target_.qp->srq_offset == 0) return nullptr;
  const uint64_t offset = receive_queue()->tag_list_offset;
  return offset ? reinterpret_cast<transport::TagList*>(target_.base + offset) : nullptr;
}

// The shm link runs the responder in the requester's process: the range is
// that process's own memory, under a key it registered, in the requester
// QP's PD, that QP allowing remote READ.
bool ShmResponderPort::requester_range(uint32_t requester_qpn, uint64_t va, uint32_t rkey, uint64_t length,
                                       iovec& out) {
  TargetQp requester;
  if (!resolve(host_, requester_qpn, requester) || requester.proc != host_.proc()) return false;
  if ((requester.qp->access.load(std::memory_order_acquire) & IBV_ACCESS_REMOTE_READ) == 0) return false;
  host::MrRecord mr;
  if (!host_.registry().lookup_mr(rkey, mr) || mr.proc != host_.proc()) return false;
  const transport::MemoryKey key = link::registered_key(mr);
  if (!transport::remote_key_allows(key, requester.qp->pd_id, requester_qpn, IBV_ACCESS_REMOTE_READ, va, length))
    return false;
  out = iovec{transport::owner_address(key, va), static_cast<size_t>(length)};
  return true;
}

void ShmResponderPort::raise(uint32_t detail) {
  if (target_.proc != host::kHostOwned) {
    host_.notify(target_.proc, target_.pid,
                 host::Event{static_cast<uint32_t>(host::EventKind::kQpAsync), target_.qp->owner_qp_id, detail,
                             target_.qpn});
    return;
  }
  // A TGT QP's events go to every handle to it, in every process.
  const host::TgtQpRecord* record = host_.registry().tgt_qp(target_.qpn);
  if (record == nullptr) return;
  host::TgtHandle holders[host::kMaxTgtHolders];
  const uint32_t n = host_.registry().tgt_holders(*record, holders);
  for (uint32_t i = 0; i < n; ++i)
    host_.notify(holders[i].proc, holders[i].pid,
                 host::Event{static_cast<uint32_t>(host::EventKind::kQpAsync), holders[i].qp_id, detail, target_.qpn});
}

// The responder QP moves to ERROR; its owner flushes it and reports `event`.
void ShmResponderPort::fail_qp(ibv_event_type event) {
  uint32_t state = target_.qp->state.load(std::memory_order_acquire);
  while (state != IBV_QPS_ERR && state != host::SharedQp::kDestroyed && state != IBV_QPS_RESET) {
    if (target_.qp->state.compare_exchange_weak(state, IBV_QPS_ERR, std::memory_order_acq_rel)) {
      raise(event);
      return;
    }
  }
}

void ShmResponderPort::established() {
  if (target_.qp->comm_established.load(std::memory_order_relaxed)) return;
  if (target_.qp->comm_established.exchange(1, std::memory_order_acq_rel) == 0 &&
      target_.qp->state.load(std::memory_order_acquire) == IBV_QPS_RTR)
    raise(IBV_EVENT_COMM_EST);
}

// A responder in a process that died answers nothing: no RNR NAK, no error
// NAK. Its segment stays mapped here, but the host registry reclaims its MRs
// whenever another process registers, so without this check a dead peer would
// show up as RNR forever (rnr_retry 7) or as a spurious REM_ACCESS_ERR. Only
// asked on those slow paths (it reads /proc). By the owner's whole
// identity: once the dead peer's registry slot is reclaimed, a new process
// may hold the same slot, and after the pids wrap, the same pid.
bool ShmResponderPort::gone() { return owner_gone(host_.registry(), target_, host_.proc()); }

}  // namespace softhca::shm
