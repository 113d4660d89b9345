#include "link/shm/target.hpp"

namespace softhca::shm {

bool resolve(host::Attachment& host, uint32_t qpn, TargetQp& out) {
  const host::QpSlot* slot = host.registry().find_qp(qpn);
  if (slot == nullptr) return false;
  const uint32_t proc = slot->proc;
  const uint64_t offset = slot->shm_offset;
  // The slot may have been released and reused between the reads above.
  if (host.registry().find_qp(qpn) != slot) return false;
  char* base = host.segment_base(proc);
  if (base == nullptr) return false;
  auto* qp = reinterpret_cast<host::SharedQp*>(base + offset);
  if (qp->qpn != qpn) return false;
  out = TargetQp{qp, base, host.pid_of(proc), proc, qpn};
  return out.pid != 0;
}

}  // namespace softhca::shm
