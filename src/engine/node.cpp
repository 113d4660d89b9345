#include "engine/node.hpp"

#include "engine/context.hpp"

#include <pthread.h>

#include "engine/completion_queue.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "host/process_identity.hpp"

namespace softhca::engine {
namespace {

std::mutex g_node_mutex;
Node* g_node = nullptr;
uint32_t g_node_users = 0;

void forget_node_after_fork() {
  // The child has no progress thread and another pid: it starts afresh on its
  // next ibv_open_device. The parent's objects stay unusable in the child, as
  // with hardware RDMA without fork support.
  g_node = nullptr;
  g_node_users = 0;
  host::refresh_self_pid();
}

}  // namespace

Result<Node*> Node::acquire() {
  std::lock_guard guard(g_node_mutex);
  if (g_node == nullptr) {
    static bool atfork_installed = false;
    if (!atfork_installed) {
      pthread_atfork(nullptr, nullptr, forget_node_after_fork);
      atfork_installed = true;
    }
    auto* node = new Node();
    if (auto started = node->start(); !started) {
      delete node;
      return fail(started.error());
    }
    g_node = node;
  }
  ++g_node_users;
  return g_node;
}

Context* Node::hold_context(uint64_t cmd_inode) {
  std::lock_guard guard(contexts_mutex_);
  auto it = contexts_.find(cmd_inode);
  if (it == contexts_.end() || !it->second->try_hold()) return nullptr;
  return it->second;
}

void Node::release() {
  std::lock_guard guard(g_node_mutex);
  if (g_node == nullptr || --g_node_users != 0) return;
  delete g_node;
  g_node = nullptr;
}

Result<void> Node::start() {
  auto host = host::Attachment::open();
  if (!host) return fail(host.error());
  host_ = *host;
  shm_link_ = link::make_shm_link(*host_);
  udp_link_ = link::make_udp_link(*host_);
  multicast_ = std::make_unique<MulticastMembership>(*udp_link_);
  progress_.start(host_->header(), *this);
  return {};
}

Node::~Node() {
  progress_.stop();
  multicast_.reset();
  udp_link_.reset();  // joins its thread, which may still relay answers to QPs through the tables
  shm_link_.reset();
  delete host_;
}

void Node::add_waiting(QueuePair* qp) {
  {
    std::lock_guard guard(waiting_mutex_);
    if (waiting_.insert(qp).second) waiting_count_.fetch_add(1, std::memory_order_relaxed);
  }
  // Wake the thread so it recomputes its sleep deadline.
  host_->ring_own_doorbell();
}

void Node::remove_waiting(QueuePair* qp) {
  std::lock_guard guard(waiting_mutex_);
  if (waiting_.erase(qp) != 0) waiting_count_.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<std::pair<QueuePair*, uint32_t>> Node::waiting_snapshot() {
  // A QP's id is read here, under the mutex, while the QP is still on the list:
  // ~QueuePair takes this mutex (remove_waiting) before the QP is freed. Reading
  // it later, outside the lock, raced with destroy_qp (a use after free TSan found).
  std::vector<std::pair<QueuePair*, uint32_t>> out;
  std::lock_guard guard(waiting_mutex_);
  out.reserve(waiting_.size());
  for (QueuePair* qp : waiting_) out.emplace_back(qp, qp->id());
  return out;
}

uint64_t Node::run_timers(uint64_t now) {
  // A QP found here may be destroyed concurrently; the object table guards its
  // lifetime, and the pointer is only compared until the table vouches for it.
  uint64_t earliest = 0;
  for (auto [qp, id] : waiting_snapshot()) {
    qps_.with(id, [&](QueuePair& live) {
      if (&live != qp) return;
      live.progress(now);
      const uint64_t d = live.next_deadline();
      if (d != 0 && (earliest == 0 || d < earliest)) earliest = d;
    });
  }
  return earliest;
}

uint64_t Node::run_due(uint64_t now_ns) { return has_waiting() ? run_timers(now_ns) : 0; }

void Node::on_event(const host::Event& event) {
  switch (static_cast<host::EventKind>(event.kind)) {
    case host::EventKind::kCqNotify:
      cqs_.with(event.object, [&](CompletionQueue& cq) {
        if (cq.serial() == event.tag) cq.on_remote_notify();
      });
      break;
    case host::EventKind::kCqError:
      cqs_.with(event.object, [&](CompletionQueue& cq) {
        if (cq.serial() == event.tag) cq.on_overrun();
      });
      break;
    case host::EventKind::kQpAsync:
      qps_.with(event.object, [&](QueuePair& qp) {
        // A QP whose creation has not yet handed it to the application
        // (its number may still be being written), or one of another
        // number: the event is a destroyed QP's that had this id.
        if (qp.handle.load(std::memory_order_acquire) == nullptr) return;
        if (qp.qpn() == event.tag) qp.on_remote_event(event.detail);
      });
      break;
    case host::EventKind::kSrqLimit:
      srqs_.with(event.object, [&](SharedReceiveQueue& srq) {
        if (srq.serial() == event.tag) srq.on_limit_reached();
      });
      break;
    case host::EventKind::kTgtSync:
      qps_.with(event.object, [](QueuePair& qp) { qp.sync_tgt_channel(); });
      break;
  }
}

}  // namespace softhca::engine
