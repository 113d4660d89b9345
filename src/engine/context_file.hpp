// The file behind a context's cmd_fd: a memfd that holds what every process
// importing the context (ibv_import_device on a copy of the fd, passed by
// SCM_RIGHTS or inherited) must see of it, as a kernel's uverbs file holds
// the objects of a context that several processes share:
//   - the PDs, MRs and DMs made in the context, in any of those processes,
//     by the handle numbers the application sees (what ibv_import_pd, _mr
//     and _dm look up), with the process that made each;
//   - how many objects of each process use each PD and DM (so that
//     ibv_dealloc_pd refuses, EBUSY, while another process's QP uses the
//     PD, and stops refusing once that process is gone);
//   - the context's device memory: DMs live in the file, so that every
//     process that maps it reaches them.
// Changes are rare (object creation and destruction): a spinlock in the
// file orders writers; readers look entries up under it too.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "host/host_registry.hpp"

#include "common/result.hpp"

namespace softhca::engine {

enum class ExportKind : uint32_t { kFree = 0, kPd = 1, kMr = 2, kDm = 3 };

// What another process learns of an exported object.
struct ExportRecord {
  ExportKind kind = ExportKind::kFree;
  uint32_t handle = 0;
  uint32_t proc = 0;       // the registry slot of the process that made it
  uint32_t pid = 0;
  uint32_t pd_handle = 0;  // an MR's PD
  uint32_t access = 0;     // an MR's access flags
  uint64_t length = 0;     // an MR's or a DM's length
  uint64_t iova = 0;       // an MR's iova
  uint64_t offset = 0;     // a DM's place in the file
};

class ContextFile {
 public:
  static constexpr uint32_t kMaxExports = 1 << 16;
  // (object, process) pairs with objects of that process using that PD or DM.
  static constexpr uint32_t kMaxUserRecords = 1 << 12;
  // Device memory a context holds at once, in all processes together.
  static constexpr uint64_t kDeviceMemoryBytes = 1 << 20;

  // Lays the table out in `fd` (a new, empty memfd) for the context that
  // process `creator` of host registry `registry` (its file_identity) opens.
  static Result<ContextFile*> create(int fd, const host::ProcessIdentity& creator, uint64_t registry);
  // Maps the table of another process's context; no_such_device_or_address
  // when `fd` is no context's file, or the context is closed everywhere.
  static Result<ContextFile*> attach(int fd);
  ~ContextFile();
  ContextFile(const ContextFile&) = delete;
  ContextFile& operator=(const ContextFile&) = delete;

  // The process that opened the context (for the importer's checks): its
  // slot, pid and start time, so that a later process that got both the
  // slot and the pid is not taken for it.
  host::ProcessIdentity creator() const;
  uint64_t registry() const;

  // One engine context (in any process) holds the file; the last release
  // closes the context everywhere: attach refuses it from then on.
  void hold();
  void release();

  // Records `record` (kind and handle name it); false when the table is full.
  bool publish(const ExportRecord& record);
  void withdraw(ExportKind kind, uint32_t handle);
  std::optional<ExportRecord> find(ExportKind kind, uint32_t handle) const;
  // The objects of process `who` that use PD or DM `handle` change by `delta`.
  void add_users(ExportKind kind, uint32_t handle, const host::ProcessIdentity& who, int delta);
  // The users of PD or DM `handle` in processes other than slot `self` that
  // `alive(who)` says still run: a dead process's objects are gone with it
  // (its counts are dropped here).
  uint32_t users_elsewhere(ExportKind kind, uint32_t handle, uint32_t self,
                           const std::function<bool(const host::ProcessIdentity&)>& alive);
  // A handle no process of the context has given yet (device memory has
  // no number of its own).
  uint32_t next_handle();

  // Device memory: `length` bytes of the file (whole pages), or
  // not_enough_memory; the range is the file's offset.
  Result<uint64_t> take_device_memory(uint64_t length);
  // Withdraws DM `handle` and gives its pages back to the file; false when
  // it is not there (another process freed it already).
  bool retire_device_memory(uint32_t handle);
  // The file's device memory as mapped here.
  char* device_memory(uint64_t offset) const;

  struct Layout;  // the file's layout (context_file.cpp)

 private:
  explicit ContextFile(Layout* layout) : layout_(layout) {}
  void lock() const;
  void unlock() const;
  Layout* layout_;
};

}  // namespace softhca::engine
