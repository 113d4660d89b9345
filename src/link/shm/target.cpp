#include "link/shm/target.hpp"

namespace softhca::shm {

bool resolve(host::Attachment& host, uint32_t qpn, TargetQp& out) {
  const host::QpSlot* slot = host.registry().find_qp(qpn);
  if (slot == nullptr) return false;
  // Acquire: the QP's shared state, written before publish_qp, is then
  // visible; 0 while it is still being created.
  const uint64_t incarnation = slot->incarnation.load(std::memory_order_acquire);
  if (incarnation == 0) return false;
  const uint32_t proc = slot->proc.load(std::memory_order_relaxed);
  const uint64_t offset = slot->shm_offset.load(std::memory_order_relaxed);
  // The slot may have been released and reused between the reads above.
  if (host.registry().find_qp(qpn) != slot || slot->incarnation.load(std::memory_order_acquire) != incarnation)
    return false;
  if (proc == host::kHostOwned) {
    // A TGT QP: its record is in the registry, and it has no memory or
    // queues of its own (each message names the SRQ that has them).
    host::TgtQpRecord* record = host.registry().tgt_qp(qpn);
    if (record == nullptr) return false;
    out = TargetQp{&record->shared, slot, incarnation, nullptr, 0, proc, qpn};
    return true;
  }
  char* base = host.segment_base(proc);
  if (base == nullptr) return false;
  const host::ProcessIdentity owner = host.registry().identity_of(proc);
  out = TargetQp{reinterpret_cast<host::SharedQp*>(base + offset), slot, incarnation, base, owner.pid, proc, qpn};
  out.start_time = owner.start_time;
  return out.pid != 0;
}

}  // namespace softhca::shm
