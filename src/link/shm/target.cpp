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
  char* base = host.segment_base(proc);
  if (base == nullptr) return false;
  out = TargetQp{reinterpret_cast<host::SharedQp*>(base + offset), slot, incarnation, base, host.pid_of(proc), proc, qpn};
  return out.pid != 0;
}

}  // namespace softhca::shm
