// Device memory (ibv_alloc_dm): on a NIC, a small memory on the adapter that
// peers reach without crossing PCIe to the host. softhca has no adapter, so
// it is pages of the context's file (ContextFile), which every process that
// shares the context maps (ibv_import_dm), handed out from a per-process
// budget of max_dm_size bytes, read and written with ibv_memcpy_to_dm/from_dm
// under the device's rules (4-byte granularity, within the allocation), and
// made reachable by peers through ibv_reg_dm_mr like any registered memory.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/result.hpp"
#include "engine/context_file.hpp"
#include "engine/shared_users.hpp"

namespace softhca::engine {

class Context;

class DeviceMemory {
 public:
  // `length` bytes aligned to 2^log_align (at most a page); no_memory when
  // the process's budget is spent.
  static Result<DeviceMemory*> allocate(Context& context, uint64_t length, uint32_t log_align);
  // This process's handle onto DM `record` that another process sharing
  // the context allocated (ibv_import_dm).
  static DeviceMemory* adopt(Context& context, const ExportRecord& record);
  // ibv_free_dm: the memory goes back to the context, for every process.
  // (Deleting an adopted handle without it leaves the DM to its owner.)
  void free_everywhere();
  // The MRs over it, in every process that shares the context: ibv_free_dm
  // refuses (EBUSY) while any is registered.
  void attach() { users_.attach(); }
  void detach() { users_.detach(); }
  bool in_use() const { return users_.in_use(); }
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Copies of whole 4-byte words inside the allocation (invalid_argument otherwise).
  Result<void> copy_to(uint64_t offset, const void* from, uint64_t length);
  Result<void> copy_from(void* to, uint64_t offset, uint64_t length) const;
  // [offset, offset + length) lies inside the allocation.
  bool holds(uint64_t offset, uint64_t length) const {
    return offset <= length_ && length <= length_ - offset;
  }

  void* base() const { return base_; }
  // The handle ibv_import_dm names it by (unique in its context).
  uint32_t handle() const { return handle_; }
  uint64_t length() const { return length_; }
  bool adopted() const { return adopted_; }
  Context& context() { return context_; }

 private:
  DeviceMemory(Context& context, void* base, uint64_t length, uint32_t handle, bool adopted)
      : context_(context),
        base_(base),
        length_(length),
        handle_(handle),
        adopted_(adopted),
        users_(context, ExportKind::kDm, handle) {}

  Context& context_;
  void* base_;  // in the context's file, as mapped here
  uint64_t length_;
  uint32_t handle_;
  bool adopted_;
  SharedUsers users_;  // the MRs over it
};

}  // namespace softhca::engine
