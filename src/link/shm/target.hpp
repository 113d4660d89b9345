// A target QP on this host as the shm link reaches it: its shared state in
// the owner's segment (mapped here), and the guards an initiator holds while
// it works on it.
#pragma once

#include <cstdint>

#include "host/attachment.hpp"
#include "host/shared_queues.hpp"

namespace softhca::shm {

struct TargetQp {
  host::SharedQp* qp = nullptr;
  char* base = nullptr;  // the target's segment in our address space
  uint32_t pid = 0;
  uint32_t proc = 0;
  uint32_t qpn = 0;
  // The owner's backing file as mapped here (Attachment::backing_view),
  // kept with the target so that an operation does not look it up: the
  // owner's file does not change while its QP lives.
  char* backing = nullptr;
  uint64_t backing_length = 0;
};

// Finds QP `qpn` anywhere on the host; false if it does not exist or cannot be reached.
bool resolve(host::Attachment& host, uint32_t qpn, TargetQp& out);

// Whether `target` is still the QP it was resolved as: not destroyed, its
// memory not handed to another QP. Asked only under a MemoryAccess to the
// target's process, whose fence a destroyer waits out after it marks the QP
// destroyed (QueuePair's destructor): either this sees kDestroyed, or the
// destroyer waits until this access ends before the memory can be reused.
inline bool still_there(const TargetQp& target) {
  return target.qp->qpn == target.qpn &&
         target.qp->state.load(std::memory_order_seq_cst) != host::SharedQp::kDestroyed;
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
