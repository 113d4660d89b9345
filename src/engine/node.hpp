// The node: this process's attachment to the host. It holds the host registry,
// the process segment, the peers' segments mapped so far, the tables that turn
// ids carried in shared events back into objects, and the one progress thread
// that does what no application call can: signal completion channels and async
// events raised by other processes, and drive timed retries (RNR, transport
// timeout) while the application sleeps. The thread sleeps on a futex in the
// segment when there is nothing to do.
//
// Created at the first ibv_open_device, released with the last context. This is
// the device registry: the only process-wide mutable state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "engine/limits.hpp"
#include "engine/object_quota.hpp"
#include "host/host_registry.hpp"
#include "host/process_segment.hpp"
#include "link/shm/shared_queues.hpp"

namespace softhca::engine {

class CompletionQueue;
class QueuePair;
class SharedReceiveQueue;

// Ids for objects named in shared events; 0 is never used.
template <typename T>
class ObjectTable {
 public:
  uint32_t add(T* object) {
    std::lock_guard guard(mutex_);
    if (!free_.empty()) {
      const uint32_t id = free_.back();
      free_.pop_back();
      objects_[id] = object;
      return id;
    }
    objects_.push_back(object);
    return static_cast<uint32_t>(objects_.size() - 1);
  }
  void remove(uint32_t id) {
    std::lock_guard guard(mutex_);
    objects_[id] = nullptr;
    free_.push_back(id);
  }
  // Runs fn(object) with the table locked, so the object cannot be removed meanwhile.
  template <typename Fn>
  void with(uint32_t id, Fn&& fn) {
    std::lock_guard guard(mutex_);
    if (id < objects_.size() && objects_[id] != nullptr) fn(*objects_[id]);
  }

 private:
  std::mutex mutex_;
  std::vector<T*> objects_{nullptr};
  std::vector<uint32_t> free_;
};

class Node {
 public:
  // The node of this process, created on first use; every acquire() is paired with release().
  static Result<Node*> acquire();
  static void release();

  host::HostRegistry& registry() { return *registry_; }
  host::ProcessSegment& segment() { return *segment_; }
  uint32_t proc() const { return proc_; }
  uint32_t pid() const { return pid_; }

  // The base of the segment of registry process `proc` (ours or a peer's), or nullptr.
  char* segment_base(uint32_t proc);
  uint32_t pid_of(uint32_t proc) const { return registry_->proc(proc).pid.load(std::memory_order_acquire); }

  // Queues an event for the owner of `proc` and rings its doorbell.
  // Only while process `pid` still holds registry slot `proc`: a reclaimed
  // slot may belong to a newcomer that knows nothing of the event's object.
  void notify(uint32_t proc, uint32_t pid, const shm::Event& event);

  ObjectTable<CompletionQueue>& cqs() { return cqs_; }
  ObjectTable<QueuePair>& qps() { return qps_; }
  ObjectTable<SharedReceiveQueue>& srqs() { return srqs_; }

  // What this process may hold of the objects that are not host-wide.
  ObjectQuota& cq_quota() { return cq_quota_; }
  ObjectQuota& srq_quota() { return srq_quota_; }
  ObjectQuota& pd_quota() { return pd_quota_; }

  // A QP with work parked until a deadline (RNR or transport retry) asks to be progressed.
  void add_waiting(QueuePair* qp);
  void remove_waiting(QueuePair* qp);
  bool has_waiting() const { return waiting_count_.load(std::memory_order_relaxed) != 0; }
  // Progresses waiting QPs whose deadline passed (called from poll paths too).
  void run_timers(uint64_t now_ns);

  static uint64_t now_ns();

 private:
  Node() = default;
  Result<void> start();
  void stop();
  void progress_loop();
  void dispatch(const shm::Event& event);
  // The waiting QPs with their object-table ids (read under the lock).
  std::vector<std::pair<QueuePair*, uint32_t>> waiting_snapshot();

  host::HostRegistry* registry_ = nullptr;
  host::ProcessSegment* segment_ = nullptr;
  host::PeerSegments peers_;
  uint32_t proc_ = 0;
  uint32_t pid_ = 0;
  ObjectTable<CompletionQueue> cqs_;
  ObjectTable<QueuePair> qps_;
  ObjectTable<SharedReceiveQueue> srqs_;
  ObjectQuota cq_quota_{limits::kMaxCq};
  ObjectQuota srq_quota_{limits::kMaxSrq};
  ObjectQuota pd_quota_{limits::kMaxPd};

  std::mutex waiting_mutex_;
  std::set<QueuePair*> waiting_;
  std::atomic<uint32_t> waiting_count_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace softhca::engine
