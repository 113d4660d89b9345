// The host's table of raw packet flows (ibv_create_flow): every process's
// flows, so that a raw QP's frame reaches the raw QPs of every process of
// the host whose flows match it. A shared file of the host directory, like
// the registry; its entries are opaque to this layer (the link stores its
// rule and target in them). Changes happen under a robust mutex and bump
// `generation`, so readers rebuild their copy only after a change.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "host/shared_file.hpp"

namespace softhca::host {

class HostRegistry;
struct ProcessIdentity;

inline constexpr uint32_t kMaxRawFlows = 128;
inline constexpr std::size_t kRawFlowPayloadBytes = 2048;

struct RawFlowEntry {
  uint32_t in_use = 0;
  uint32_t proc = 0;  // the owner's process slot,
  uint32_t pid = 0;   // its pid
  uint64_t start_time = 0;  // and start: a later process in the slot, even with the pid, is not the owner
  uint32_t payload_len = 0;
  uint64_t id = 0;    // unique within the owner
  alignas(8) unsigned char payload[kRawFlowPayloadBytes];
};

struct RawFlowsLayout {
  SharedFileHeader header;
  pthread_mutex_t mutex;  // robust, process-shared
  std::atomic<uint64_t> generation;
  RawFlowEntry entries[kMaxRawFlows];
};

class RawFlows {
 public:
  // The table of the calling process's host (host_directory()).
  static Result<RawFlows*> open();
  // The table of directory `dir` (tests).
  static Result<RawFlows*> open_in(const std::string& dir);
  ~RawFlows();

  // Adds the flow `id` of process `owner`; an entry of a process that
  // `registry` says is gone is taken back first when the table is full.
  // ENOMEM when it stays full; EINVAL for a payload that does not fit.
  Result<void> add(const ProcessIdentity& owner, uint64_t id, const void* payload, std::size_t len,
                   const HostRegistry& registry);
  // Removes flow `id` of process `owner`. The whole identity matters: a
  // process that died left its entries, ids counting from 1 as ours do,
  // under the slot we may have now, and maybe with our pid.
  void remove(const ProcessIdentity& owner, uint64_t id);
  // seq_cst, as the bump in add() and remove(): a sender that announced an
  // access (HostRegistry::begin_access) and then reads the generation sees a
  // removal whose fence_accesses did not see its announcement.
  uint64_t generation() const { return layout_->generation.load(std::memory_order_seq_cst); }
  // The live entries now (those of processes `registry` says are alive).
  void snapshot(std::vector<RawFlowEntry>& out, const HostRegistry& registry, uint64_t& generation);

  RawFlows(const RawFlows&) = delete;
  RawFlows& operator=(const RawFlows&) = delete;

 private:
  explicit RawFlows(RawFlowsLayout* layout) : layout_(layout) {}
  RawFlowsLayout* layout_;
};

}  // namespace softhca::host
