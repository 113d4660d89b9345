// A device context: what ibv_open_device returns. It owns the async event queue
// (a real eventfd the application can poll) and ties its objects to the node.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"
#include "engine/context_file.hpp"
#include "engine/node.hpp"

namespace softhca::engine {

struct AsyncEvent {
  ibv_event_type type;
  void* handle;  // the application's ibv_qp / ibv_cq / ibv_srq, or nullptr for port/device events
  int port_num;
};

// Anything that can be named by an event counts the events delivered to the
// application (by ibv_get_async_event / ibv_get_cq_event) and those it acked,
// so destroy can wait until every delivered event was acked, as rdma-core does.
// Events never delivered do not count: programs that never read them must not
// hang in destroy.
class EventCounters {
 public:
  void reported() {
    std::lock_guard guard(mutex_);
    ++reported_;
  }
  void acked(uint32_t n = 1) {
    std::lock_guard guard(mutex_);
    acked_ += n;
    cond_.notify_all();
  }
  void wait_all_acked() {
    std::unique_lock guard(mutex_);
    cond_.wait(guard, [&] { return acked_ >= reported_; });
  }
  uint32_t reported_count() {
    std::lock_guard guard(mutex_);
    return reported_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cond_;
  uint32_t reported_ = 0;
  uint32_t acked_ = 0;
};

class AddressHandle;
class DeviceMemory;
class MemoryRegion;
class MemoryWindow;
class ProtectionDomain;

class Context {
 public:
  // The shim owns ibv_ah; it tells the engine how to find the AddressHandle
  // behind one, so UD work requests can be taken as the application wrote them.
  using AhTranslator = AddressHandle* (*)(ibv_ah*);
  void set_ah_translator(AhTranslator translator) { ah_translator_ = translator; }
  AddressHandle* address_handle(ibv_ah* ah) const { return ah_translator_ ? ah_translator_(ah) : nullptr; }
  // Likewise the window and the MR a bind WR names (nullptr for nullptr).
  using MwTranslator = MemoryWindow* (*)(ibv_mw*);
  using MrTranslator = MemoryRegion* (*)(ibv_mr*);
  void set_window_translators(MwTranslator mw, MrTranslator mr) {
    mw_translator_ = mw;
    mr_translator_ = mr;
  }
  MemoryWindow* memory_window(ibv_mw* mw) const { return mw_translator_ && mw ? mw_translator_(mw) : nullptr; }
  MemoryRegion* memory_region(ibv_mr* mr) const { return mr_translator_ && mr ? mr_translator_(mr) : nullptr; }

  static Result<Context*> open();
  // ibv_import_device on (a copy of) a context's cmd_fd. In the process
  // that holds that context: the same context, held once more. In another
  // process: a context of this process onto the same file, whose objects
  // and those of every other holder are shared through it (ContextFile).
  // no_such_device_or_address for any other fd, and once the context is
  // closed everywhere.
  static Result<Context*> import(int fd);
  // ibv_close_device of the opener or of an importer: the last one deletes.
  void release();
  // One more holder, unless the last one is already gone (then false).
  bool try_hold() {
    uint32_t n = holders_.load(std::memory_order_relaxed);
    while (n != 0)
      if (holders_.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) return true;
    return false;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // What ibv_import_pd / _mr / _dm find by the handle numbers the
  // application sees: the objects made in this context, while they live,
  // here and (through the context's file) in every process that shares it.
  void publish(ProtectionDomain* pd, uint32_t handle);
  void withdraw(ProtectionDomain* pd, uint32_t handle);
  // A PD of this context; one another process made is adopted here (one
  // object per PD, owned by the context until ibv_dealloc_pd destroys it).
  ProtectionDomain* find_pd(uint32_t handle);
  void publish(MemoryRegion* mr, uint32_t handle);
  void withdraw(MemoryRegion* mr, uint32_t handle);
  // An MR of this context in `pd`; one another process made is adopted
  // (a handle onto its key, owned by the context until ibv_dereg_mr).
  MemoryRegion* find_mr(uint32_t handle, ProtectionDomain& pd);
  // ibv_dealloc_pd / ibv_dereg_mr of an adopted object: it is gone for
  // every process (withdrawn from the file) and deleted here.
  void destroy_adopted(ProtectionDomain* pd);
  void destroy_adopted(MemoryRegion* mr);
  // This process's objects that use PD or DM `handle`, counted in the
  // file (delta), and the users in the other live processes.
  void add_users(ExportKind kind, uint32_t handle, int delta);
  uint32_t users_elsewhere(ExportKind kind, uint32_t handle);
  // A DM, at `offset` of the context's file.
  void publish(DeviceMemory* dm, uint32_t handle, uint64_t offset);
  void withdraw(DeviceMemory* dm, uint32_t handle) { withdraw_from(dms_, handle, dm); }
  // A DM of this context; one another process allocated is adopted.
  DeviceMemory* find_dm(uint32_t handle);
  // ibv_free_dm of an adopted DM: freed for every process, deleted here.
  void destroy_adopted(DeviceMemory* dm);
  // The file behind cmd_fd, shared with the other processes that hold the context.
  ContextFile& file() { return *file_; }

  Node& node() { return *node_; }
  int async_fd() const { return async_fd_; }
  // A file descriptor for ibv_context.cmd_fd: a real fd apps may dup (pyverbs does).
  int cmd_fd() const { return cmd_fd_; }

  void raise_async_event(const AsyncEvent& event);
  // Blocks (unless the fd is O_NONBLOCK: EAGAIN) until an event is pending.
  Result<AsyncEvent> get_async_event();
  // Drops events not yet delivered for an object being destroyed.
  void forget_events(const void* handle);

 private:
  Context() = default;
  ~Context();
  template <typename T>
  void publish_in(std::unordered_map<uint32_t, T*>& map, uint32_t handle, T* object) {
    std::lock_guard guard(objects_mutex_);
    map[handle] = object;
  }
  template <typename T>
  void withdraw_from(std::unordered_map<uint32_t, T*>& map, uint32_t handle, T* object) {
    std::lock_guard guard(objects_mutex_);
    if (auto it = map.find(handle); it != map.end() && it->second == object) map.erase(it);
  }
  template <typename T>
  T* find_in(std::unordered_map<uint32_t, T*>& map, uint32_t handle) {
    std::lock_guard guard(objects_mutex_);
    auto it = map.find(handle);
    return it == map.end() ? nullptr : it->second;
  }

  Node* node_ = nullptr;
  std::atomic<uint32_t> holders_{1};  // the opener and each importer
  uint64_t cmd_inode_ = 0;
  // The table shared with the other processes that hold this context.
  ContextFile* file_ = nullptr;
  std::mutex objects_mutex_;
  // Objects other processes made, adopted here (find_pd, find_mr).
  std::vector<ProtectionDomain*> adopted_pds_;
  std::vector<MemoryRegion*> adopted_mrs_;
  std::vector<DeviceMemory*> adopted_dms_;
  std::unordered_map<uint32_t, ProtectionDomain*> pds_;
  std::unordered_map<uint32_t, MemoryRegion*> mrs_;
  std::unordered_map<uint32_t, DeviceMemory*> dms_;
  AhTranslator ah_translator_ = nullptr;
  MwTranslator mw_translator_ = nullptr;
  MrTranslator mr_translator_ = nullptr;
  int async_fd_ = -1;
  int cmd_fd_ = -1;
  std::mutex mutex_;
  std::deque<AsyncEvent> events_;
};

}  // namespace softhca::engine
