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

// Holds a target QP against destruction while an initiator works on it.
class TargetUse {
 public:
  explicit TargetUse(host::SharedQp* qp) : qp_(qp) { qp_->users.fetch_add(1, std::memory_order_acq_rel); }
  ~TargetUse() { qp_->users.fetch_sub(1, std::memory_order_release); }
  TargetUse(const TargetUse&) = delete;
  TargetUse& operator=(const TargetUse&) = delete;

 private:
  host::SharedQp* qp_;
};

// Announces that this thread is about to reach registered memory of the
// target's process (HostRegistry::begin_access): a deregistration there
// waits for it to end. Keys are validated only after this.
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
