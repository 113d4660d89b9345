#include "engine/node.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "common/log.hpp"
#include "engine/completion_queue.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "link/shm/remote_memory.hpp"

namespace softhca::engine {
namespace {

std::mutex g_node_mutex;
Node* g_node = nullptr;
uint32_t g_node_users = 0;

constexpr uint64_t kSegmentMagic = 0x736f667468736567ULL;

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void forget_node_after_fork() {
  // The child has no progress thread and another pid: it starts afresh on its
  // next ibv_open_device. The parent's objects stay unusable in the child, as
  // with hardware RDMA without fork support.
  g_node = nullptr;
  g_node_users = 0;
  shm::refresh_self_pid();
}

}  // namespace

uint64_t Node::now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
}

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

void Node::release() {
  std::lock_guard guard(g_node_mutex);
  if (g_node == nullptr || --g_node_users != 0) return;
  g_node->stop();
  delete g_node;
  g_node = nullptr;
}

Result<void> Node::start() {
  auto registry = host::HostRegistry::open();
  if (!registry) return fail(registry.error());
  registry_ = *registry;
  auto segment = host::ProcessSegment::create();
  if (!segment) return fail(segment.error());
  segment_ = *segment;
  pid_ = shm::self_pid();
  auto* header = segment_->at<shm::SegmentHeader>(0);
  header->pid = pid_;
  header->magic = kSegmentMagic;
  auto proc = registry_->register_process(pid_, static_cast<uint32_t>(segment_->fd()));
  if (!proc) {
    SOFTHCA_ERROR("too many softhca processes on this host");
    return fail(proc.error());
  }
  proc_ = *proc;
  thread_ = std::thread([this] { progress_loop(); });
  return {};
}

void Node::stop() {
  if (thread_.joinable()) {
    stopping_.store(true);
    auto* header = segment_->at<shm::SegmentHeader>(0);
    header->doorbell.fetch_add(1);
    futex(&header->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
    thread_.join();
  }
  if (registry_ != nullptr) registry_->unregister_process(proc_);
  delete segment_;
  delete registry_;
}

char* Node::segment_base(uint32_t proc) {
  if (proc == proc_) return segment_->base();
  const host::ProcSlot& slot = registry_->proc(proc);
  const uint32_t pid = slot.pid.load(std::memory_order_acquire);
  if (pid == 0) return nullptr;
  return peers_.map(pid, slot.segment_fd, slot.start_time);
}

void Node::notify(uint32_t proc, uint32_t pid, const shm::Event& event) {
  if (proc != proc_ && registry_->proc(proc).pid.load(std::memory_order_acquire) != pid) return;
  char* base = segment_base(proc);
  if (base == nullptr) return;
  auto* header = reinterpret_cast<shm::SegmentHeader*>(base);
  if (!header->push(event)) {
    SOFTHCA_WARN("event ring of process %u is full; event dropped", header->pid);
    return;
  }
  header->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleeping.load(std::memory_order_seq_cst)) futex(&header->doorbell, FUTEX_WAKE, 1, nullptr);
}

void Node::add_waiting(QueuePair* qp) {
  {
    std::lock_guard guard(waiting_mutex_);
    if (waiting_.insert(qp).second) waiting_count_.fetch_add(1, std::memory_order_relaxed);
  }
  // Wake the thread so it recomputes its sleep deadline.
  auto* header = segment_->at<shm::SegmentHeader>(0);
  header->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleeping.load(std::memory_order_seq_cst)) futex(&header->doorbell, FUTEX_WAKE, 1, nullptr);
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

void Node::run_timers(uint64_t now) {
  // A QP found here may be destroyed concurrently; the object table guards its
  // lifetime, and the pointer is only compared until the table vouches for it.
  for (auto [qp, id] : waiting_snapshot()) {
    qps_.with(id, [&](QueuePair& live) {
      if (&live == qp) live.progress(now);
    });
  }
}

void Node::dispatch(const shm::Event& event) {
  switch (static_cast<shm::EventKind>(event.kind)) {
    case shm::EventKind::kCqNotify:
      cqs_.with(event.object, [](CompletionQueue& cq) { cq.on_remote_notify(); });
      break;
    case shm::EventKind::kCqError:
      cqs_.with(event.object, [](CompletionQueue& cq) { cq.on_overrun(); });
      break;
    case shm::EventKind::kQpAsync:
      qps_.with(event.object, [&](QueuePair& qp) { qp.on_remote_event(event.detail); });
      break;
    case shm::EventKind::kSrqLimit:
      srqs_.with(event.object, [](SharedReceiveQueue& srq) { srq.on_limit_reached(); });
      break;
  }
}

// Thread: the node's progress thread. Sleeps on the doorbell futex with the
// earliest retry deadline as timeout (none when nothing is parked).
void Node::progress_loop() {
  auto* header = segment_->at<shm::SegmentHeader>(0);
  shm::Event event;
  while (!stopping_.load()) {
    while (header->pop(event)) dispatch(event);
    uint64_t deadline = 0;
    if (has_waiting()) {
      const uint64_t now = now_ns();
      run_timers(now);
      for (auto [qp, id] : waiting_snapshot())
        qps_.with(id, [&](QueuePair& live) {
          if (&live != qp) return;
          const uint64_t d = live.next_deadline();
          if (d != 0 && (deadline == 0 || d < deadline)) deadline = d;
        });
    }
    const uint32_t seen = header->doorbell.load(std::memory_order_seq_cst);
    header->sleeping.store(1, std::memory_order_seq_cst);
    if (header->pop(event)) {
      header->sleeping.store(0, std::memory_order_relaxed);
      dispatch(event);
      continue;
    }
    if (stopping_.load()) break;
    timespec timeout{};
    const timespec* wait_for = nullptr;
    if (deadline != 0) {
      const uint64_t now = now_ns();
      const uint64_t delta = deadline > now ? deadline - now : 0;
      timeout.tv_sec = static_cast<time_t>(delta / 1'000'000'000ULL);
      timeout.tv_nsec = static_cast<long>(delta % 1'000'000'000ULL);
      wait_for = &timeout;
    }
    if (wait_for == nullptr || timeout.tv_sec != 0 || timeout.tv_nsec != 0)
      futex(&header->doorbell, FUTEX_WAIT, seen, wait_for);
    header->sleeping.store(0, std::memory_order_relaxed);
  }
}

}  // namespace softhca::engine
