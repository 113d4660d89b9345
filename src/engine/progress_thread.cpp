#include "engine/progress_thread.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

#include "common/clock.hpp"

namespace softhca::engine {
namespace {

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

void ProgressThread::start(host::SegmentHeader& doorbell, Work& work) {
  doorbell_ = &doorbell;
  work_ = &work;
  // Returns once the thread holds owner_alive: from then on peers see this
  // process as running (its raw flows steer only while it does).
  std::latch holding(1);
  thread_ = std::thread([this, &holding] {
    pthread_setname_np(pthread_self(), "softhca-events");
    loop(holding);
  });
  holding.wait();
}

void ProgressThread::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  doorbell_->doorbell.fetch_add(1);
  futex(&doorbell_->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  thread_.join();
}

// Thread: the progress thread. The doorbell protocol: a waker queues its
// event (or its timer), bumps `doorbell`, and calls FUTEX_WAKE only if
// `sleeping` is set; the thread sets `sleeping` before its last look at the
// ring and waits only if the doorbell did not move since it looked.
void ProgressThread::loop(std::latch& holding) {
  host::SegmentHeader& header = *doorbell_;
  // Held for the thread's life: peers read it to know this process lives
  // (SegmentHeader::owner_running); the kernel marks it if we die.
  const bool holds_alive = pthread_mutex_lock(&header.owner_alive) == 0;
  holding.count_down();
  host::Event event;
  while (!stopping_.load()) {
    while (header.pop(event)) work_->on_event(event);
    const uint64_t deadline = work_->run_due(monotonic_ns());
    const uint32_t seen = header.doorbell.load(std::memory_order_seq_cst);
    header.sleeping.store(1, std::memory_order_seq_cst);
    if (header.pop(event)) {
      header.sleeping.store(0, std::memory_order_relaxed);
      work_->on_event(event);
      continue;
    }
    if (stopping_.load()) break;
    timespec timeout{};
    const timespec* wait_for = nullptr;
    if (deadline != 0) {
      timeout = time_until(deadline);
      wait_for = &timeout;
    }
    if (wait_for == nullptr || timeout.tv_sec != 0 || timeout.tv_nsec != 0)
      futex(&header.doorbell, FUTEX_WAIT, seen, wait_for);
    header.sleeping.store(0, std::memory_order_relaxed);
  }
  if (holds_alive) pthread_mutex_unlock(&header.owner_alive);
}

}  // namespace softhca::engine
