// A connected QP's one-sided operations into its peer's memory on this
// host -- RDMA WRITE and RDMA READ -- as the last direct one found the way:
// the target it reached and the grant of the key it used, kept by the QP
// and used from the top of ibv_post_send.
//
// An RDMA WRITE latency test's time is the instructions between its peer's
// signal and its own store, a READ latency test's the post and the poll of
// one READ (docs/performance.md). The direct WRITE and READ
// (ShmChannel::write_direct, copy_direct) ask their checks through the
// QP's general post, the link interface and the channel, which serve every
// operation and every link; the lane asks the same ones for these two
// operations, with what they read already found: the target QP's shared
// record, slot and segment (shm::TargetQp) and the key's grant
// (link::KeyGrant, which records every access the key grants), both kept
// from that last operation. Under the access announcement to the target's
// process, as there, each is judged again at every operation: the target
// still the same incarnation and receiving, granting remote write
// (shm::target_takes_writes) or remote read with responder resources for
// it (shm::target_takes_reads), the key's registry slot at the version of
// the grant. Whatever does not hold makes the lane answer with nothing
// done, and the operation goes the general way, which gives every outcome.
//
// Armed by the shm channel after a direct WRITE or READ succeeded,
// disarmed when the channel resolves its target again or is destroyed;
// written and read under the QP's send lock only.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "host/host_registry.hpp"
#include "link/key_grant.hpp"
#include "link/shm/copy_write.hpp"
#include "link/shm/target.hpp"

namespace softhca::shm {

struct MemoryLane {
  bool armed = false;
  uint32_t qp_type = 0;  // the requester's
  uint32_t self = 0;     // this process's registry slot
  host::HostRegistry* registry = nullptr;
  TargetQp target;
  link::KeyGrant grant;  // the rkey's, for IBV_ACCESS_REMOTE_WRITE
  uint64_t longest = 0;  // the longest WRITE the channel makes in one piece

  // The WRITE of `length` bytes from `local` (this process's, checked),
  // done: where they landed in this process's view of the target, or
  // nullptr when anything differs from what the lane was armed with
  // (nothing happened). Always inlined: it is the WRITE's critical path.
  [[gnu::always_inline]] void* write(const void* local, uint64_t length, uint64_t remote_addr, uint32_t rkey) const {
    if (length == 0 || length > longest) return nullptr;
    char* at = grant.find(rkey, IBV_ACCESS_REMOTE_WRITE, remote_addr, length);
    if (at == nullptr) return nullptr;
    // The thread's own announcement slot; a thread without one (or inside
    // another process's memory already) goes the general way, which waits
    // for a slot where it must.
    const uint32_t slot = registry->try_begin_owned_access(self, target.proc);
    if (slot == host::HostRegistry::kNoAccessSlot) return nullptr;
    const bool reaches = target_takes_writes(target, qp_type) && registry->mr_version(rkey) == grant.seq;
    if (reaches) [[likely]]
      copy_write(at, local, length);
    registry->end_access(self, slot);
    return reaches ? at : nullptr;
  }

  // The READ of `length` bytes at `remote_addr` into `local` (this
  // process's, checked for local write), done: true, or false with nothing
  // done, as write() is. An RC QP's only (UC has no READ).
  [[gnu::always_inline]] bool read(void* local, uint64_t length, uint64_t remote_addr, uint32_t rkey) const {
    if (qp_type != IBV_QPT_RC || length == 0 || length > longest) return false;
    const char* at = grant.find(rkey, IBV_ACCESS_REMOTE_READ, remote_addr, length);
    if (at == nullptr) return false;
    const uint32_t slot = registry->try_begin_owned_access(self, target.proc);
    if (slot == host::HostRegistry::kNoAccessSlot) return false;
    const bool reaches = target_takes_reads(target, qp_type) && registry->mr_version(rkey) == grant.seq;
    if (reaches) [[likely]]
      std::memcpy(local, at, length);
    registry->end_access(self, slot);
    return reaches;
  }
};

}  // namespace softhca::shm
