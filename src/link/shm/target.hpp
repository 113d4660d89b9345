// A target QP on this host as the shm link reaches it: its shared state in
// the owner's segment (mapped here), and the guards an initiator holds while
// it works on it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "host/attachment.hpp"
#include "host/shared_queues.hpp"
#include "transport/responder.hpp"

namespace softhca::shm {

struct TargetQp {
  host::SharedQp* qp = nullptr;
  // The QP's registry slot and incarnation at resolve(): still_there()
  // compares them, so that a stale target is recognised without reading the
  // segment memory it had, which may hold another object by now.
  const host::QpSlot* slot = nullptr;
  uint64_t incarnation = 0;
  char* base = nullptr;  // the target's segment in our address space (nullptr: a TGT QP)
  uint32_t pid = 0;      // 0 for a TGT QP, whose record is the host's
  uint32_t proc = 0;     // host::kHostOwned for a TGT QP
  uint32_t qpn = 0;
  // The owner's start time (host::ProcessIdentity): with proc and pid, the
  // very process that owns the QP, not a later one that got its registry
  // slot and, the pids having wrapped, its pid.
  uint64_t start_time = 0;
  // The owner's backing file as mapped here (Attachment::backing_view),
  // kept with the target so that an operation does not look it up: the
  // owner's file does not change while its QP lives.
  char* backing = nullptr;
  uint64_t backing_length = 0;
};

// Finds QP `qpn` anywhere on the host; false if it does not exist or cannot be reached.
bool resolve(host::Attachment& host, uint32_t qpn, TargetQp& out);

// Whether `target` is still the QP it was resolved as: its QPN still names
// the same incarnation in the registry. Asked only under a MemoryAccess to
// the target's process: a destroyer releases the QPN (seq_cst) and then
// waits out that fence (QueuePair's destructor), so either this sees the QPN
// released or the destroyer waits until this access ends before the QP's
// memory can be reused.
[[gnu::always_inline]] inline bool still_there(const TargetQp& target) {
  return target.slot->qpn.load(std::memory_order_seq_cst) == target.qpn &&
         target.slot->incarnation.load(std::memory_order_acquire) == target.incarnation;
}

// Under an access announcement to its process, whether `target` (another
// process's QP, not a TGT QP) takes a message of a requester of type
// `qp_type` on the direct paths, as transport::accept would let it in: still
// there, of the requester's transport, in a receiving state, its first
// message seen (COMM_EST is the general path's to raise), and an owner that
// runs (ShmResponderPort::local_views).
[[gnu::always_inline]] inline bool target_receives(const TargetQp& target, uint32_t qp_type) {
  if (!still_there(target)) return false;
  const host::SharedQp& qp = *target.qp;
  return qp.qp_type == qp_type && transport::receives_in_state(qp.state.load(std::memory_order_acquire)) &&
         qp.comm_established.load(std::memory_order_relaxed) != 0 &&
         reinterpret_cast<const host::SegmentHeader*>(target.base)->owner_running();
}

// target_receives, for an RDMA WRITE: the QP also grants remote write.
// The direct WRITE and the memory lane ask exactly this.
[[gnu::always_inline]] inline bool target_takes_writes(const TargetQp& target, uint32_t qp_type) {
  return target_receives(target, qp_type) &&
         (target.qp->access.load(std::memory_order_acquire) & IBV_ACCESS_REMOTE_WRITE) != 0;
}

// target_receives, for an RDMA READ: the QP also grants remote read and
// has responder resources for it (transport::accept, respond): what the
// direct READ (ShmChannel::copy_direct) and the memory lane ask.
[[gnu::always_inline]] inline bool target_takes_reads(const TargetQp& target, uint32_t qp_type) {
  return target_receives(target, qp_type) &&
         (target.qp->access.load(std::memory_order_acquire) & IBV_ACCESS_REMOTE_READ) != 0 &&
         target.qp->max_dest_rd_atomic.load(std::memory_order_relaxed) != 0;
}

// Whether the owner of `target` (another process's QP) is gone: it died,
// or its registry slot went to a later process, even one with its pid. A
// TGT QP is the host's and is there while any handle to it is.
inline bool owner_gone(const host::HostRegistry& registry, const TargetQp& target, uint32_t self) {
  if (target.proc == host::kHostOwned || target.proc == self) return false;
  return !registry.process_alive(host::ProcessIdentity{target.proc, target.pid, target.start_time});
}

// Whose share of the port's counters the target's answers add to: its
// owner's, or, for a TGT QP (the host's), the initiating process's `self`.
inline uint32_t counted_proc(const TargetQp& target, uint32_t self) {
  return target.proc == host::kHostOwned ? self : target.proc;
}

// Announces that this thread is about to reach the target's process: its
// registered memory and its QPs' shared state (HostRegistry::begin_access).
// A deregistration or a QP destruction there waits for it to end, so keys
// and the target QP (still_there) are validated only after this. One
// announcement in this process's own slots, on no line the target writes:
// a reference count on the target QP cost two read-modify-writes of a line
// its owner reads at every post (the QP's state), a cache-line round trip
// each way per operation.
class MemoryAccess {
 public:
  MemoryAccess(host::Attachment& host, uint32_t target_proc)
      : registry_(host.registry()), self_(host.proc()), slot_(registry_.begin_access(self_, target_proc)) {}
  ~MemoryAccess() { registry_.end_access(self_, slot_); }
  MemoryAccess(const MemoryAccess&) = delete;
  MemoryAccess& operator=(const MemoryAccess&) = delete;

 private:
  host::HostRegistry& registry_;
  uint32_t self_;
  uint32_t slot_;
};

}  // namespace softhca::shm
