// The node: this process's softhca instance. It holds the attachment to the
// host (registry, segments: host/attachment.hpp), the links that reach peer
// QPs (link/link.hpp), the tables that turn ids carried in shared events back
// into objects, the QPs with retries waiting for a deadline, and the progress
// thread (engine/progress_thread.hpp) that relays other processes' events and
// runs those retries while the application sleeps.
//
// Created at the first ibv_open_device, released with the last context. This is
// the device registry: the only process-wide mutable state.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "common/limits.hpp"
#include "common/result.hpp"
#include "engine/multicast_membership.hpp"
#include "engine/object_quota.hpp"
#include "engine/progress_thread.hpp"
#include "host/attachment.hpp"
#include "link/link.hpp"

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

class Context;

class Node final : private ProgressThread::Work {
 public:
  // The node of this process, created on first use; every acquire() is paired with release().
  static Result<Node*> acquire();
  static void release();

  host::Attachment& host() { return *host_; }
  host::HostRegistry& registry() { return host_->registry(); }
  host::ProcessSegment& segment() { return host_->segment(); }
  uint32_t proc() const { return host_->proc(); }
  uint32_t pid() const { return host_->pid(); }

  // The link to peers on this host, and the one to other hosts.
  link::Link& shm_link() { return *shm_link_; }
  link::Link& udp_link() { return *udp_link_; }
  // The connection manager's MADs between hosts: sent from this host's QP1
  // and received at it, over the udp link (link::Link::send_management,
  // receive_management).
  void send_mad(const uint8_t* sgid, const uint8_t* dgid, std::span<const uint8_t> mad) {
    udp_link_->send_management(sgid, dgid, mad);
  }
  void receive_mads(link::ManagementReceiver receiver) { udp_link_->receive_management(std::move(receiver)); }

  // Attaches this process's UD QP `qpn` to multicast group `mgid`: the host's
  // group table (delivery on this host) and the group's IP address joined on
  // `interfaces` (delivery from other hosts; group_interfaces() picks them).
  Result<void> attach_multicast(uint32_t qpn, const uint8_t* mgid, std::span<const uint32_t> interfaces) {
    if (auto r = registry().attach_mcast(mgid, qpn, proc()); !r) return r;
    multicast_->add(mgid, qpn, interfaces);
    return {};
  }
  Result<void> detach_multicast(uint32_t qpn, const uint8_t* mgid) {
    if (auto r = registry().detach_mcast(mgid, qpn); !r) return r;
    multicast_->remove(mgid, qpn);
    return {};
  }
  // A destroyed QP's groups (the registry forgets them with its QPN).
  void forget_multicast(uint32_t qpn) { multicast_->remove_qp(qpn); }

  ObjectTable<CompletionQueue>& cqs() { return cqs_; }
  ObjectTable<QueuePair>& qps() { return qps_; }
  ObjectTable<SharedReceiveQueue>& srqs() { return srqs_; }

  // What this process may hold of the objects that are not host-wide.
  ObjectQuota& cq_quota() { return cq_quota_; }
  ObjectQuota& srq_quota() { return srq_quota_; }
  ObjectQuota& pd_quota() { return pd_quota_; }
  ObjectQuota& dm_bytes() { return dm_bytes_; }

  // The open contexts by the inode of their cmd_fd, for ibv_import_device.
  void add_context(Context* context, uint64_t cmd_inode) {
    std::lock_guard guard(contexts_mutex_);
    contexts_[cmd_inode] = context;
  }
  void remove_context(Context* context) {
    std::lock_guard guard(contexts_mutex_);
    std::erase_if(contexts_, [&](const auto& entry) { return entry.second == context; });
  }
  // The context with that cmd_fd inode, held once more (Context::release), or nullptr.
  Context* hold_context(uint64_t cmd_inode);

  // XRC domains of files open in this process, counted by (st_dev, st_ino):
  // O_EXCL refuses a file whose domain is open. false if refused.
  bool open_xrc_file(uint64_t dev, uint64_t ino, bool exclusive) {
    std::lock_guard guard(xrc_files_mutex_);
    const auto key = std::make_pair(dev, ino);
    if (exclusive && xrc_files_.contains(key)) return false;
    ++xrc_files_[key];
    return true;
  }
  void close_xrc_file(uint64_t dev, uint64_t ino) {
    std::lock_guard guard(xrc_files_mutex_);
    const auto it = xrc_files_.find(std::make_pair(dev, ino));
    if (it != xrc_files_.end() && --it->second == 0) xrc_files_.erase(it);
  }

  // A QP with work parked until a deadline (RNR or transport retry) asks to be progressed.
  void add_waiting(QueuePair* qp);
  void remove_waiting(QueuePair* qp);
  bool has_waiting() const { return waiting_count_.load(std::memory_order_relaxed) != 0; }
  // A number no other CQ or SRQ of this process had (nonzero): the tag that
  // tells a relayed event's object from a later one with the same id.
  uint32_t next_serial() { return serials_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // Progresses waiting QPs whose deadline passed (called from poll paths
  // too); returns the earliest deadline still pending, 0 for none.
  uint64_t run_timers(uint64_t now_ns);

 private:
  Node() = default;
  ~Node();
  Result<void> start();
  // ProgressThread::Work
  void on_event(const host::Event& event) override;
  uint64_t run_due(uint64_t now_ns) override;
  // The waiting QPs with their object-table ids (read under the lock).
  std::vector<std::pair<QueuePair*, uint32_t>> waiting_snapshot();

  host::Attachment* host_ = nullptr;
  std::unique_ptr<link::Link> shm_link_;
  std::unique_ptr<link::Link> udp_link_;
  std::unique_ptr<MulticastMembership> multicast_;  // over udp_link_
  ObjectTable<CompletionQueue> cqs_;
  ObjectTable<QueuePair> qps_;
  ObjectTable<SharedReceiveQueue> srqs_;
  ObjectQuota cq_quota_{limits::kMaxCq};
  ObjectQuota srq_quota_{limits::kMaxSrq};
  ObjectQuota pd_quota_{limits::kMaxPd};
  ObjectQuota dm_bytes_{limits::kMaxDmSize};

  std::mutex contexts_mutex_;
  std::map<uint64_t, Context*> contexts_;
  std::mutex xrc_files_mutex_;
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> xrc_files_;

  std::mutex waiting_mutex_;
  std::set<QueuePair*> waiting_;
  std::atomic<uint32_t> waiting_count_{0};
  std::atomic<uint32_t> serials_{0};
  ProgressThread progress_;
};

}  // namespace softhca::engine
