#include "host/write_guard.hpp"

#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

namespace softhca::host {
namespace {

// The guarded range; state is 0 when no guard is up, else an odd number
// (the futex word the parked threads sleep on).
std::atomic<uint64_t> guard_begin{0};
std::atomic<uint64_t> guard_end{0};
std::atomic<uint32_t> guard_state{0};
std::atomic<uint64_t> parked{0};

// Ranges guarded before: a fault taken under a guard whose handler runs
// after the release must still be retried, not passed on. Only for a short
// while: a fault there later is the application's own (it made the pages
// read-only itself) and must reach its handler, not loop.
constexpr size_t kRecent = 16;
constexpr int64_t kRecentNs = 200'000'000;
struct RecentRange {
  std::atomic<uint64_t> begin{0};
  std::atomic<uint64_t> end{0};
  std::atomic<int64_t> released_ns{0};
};
RecentRange recent[kRecent];
std::atomic<size_t> recent_next{0};

struct sigaction previous_action {};
std::atomic<bool> installed{false};

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool in_recent(uint64_t addr) {
  const int64_t now = now_ns();
  for (auto& r : recent) {
    if (addr >= r.begin.load(std::memory_order_acquire) && addr < r.end.load(std::memory_order_acquire) &&
        now - r.released_ns.load(std::memory_order_acquire) < kRecentNs)
      return true;
  }
  return false;
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Not ours: what would have happened without us.
void pass_on(int sig, siginfo_t* info, void* context) {
  const struct sigaction& before = previous_action;
  if (before.sa_flags & SA_SIGINFO) {
    if (before.sa_sigaction != nullptr) {
      before.sa_sigaction(sig, info, context);
      return;
    }
  } else if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
    before.sa_handler(sig);
    return;
  }
  // Default action: put it back; returning re-runs the faulting instruction,
  // which faults again and ends the process as the signal would have.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  installed.store(false, std::memory_order_release);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uint64_t addr = reinterpret_cast<uint64_t>(info->si_addr);
  if (info->si_code == SEGV_ACCERR) {
    for (;;) {
      const uint32_t state = guard_state.load(std::memory_order_acquire);
      if (state == 0 || addr < guard_begin.load(std::memory_order_acquire) ||
          addr >= guard_end.load(std::memory_order_acquire))
        break;
      parked.fetch_add(1, std::memory_order_relaxed);
      futex_wait(guard_state, state);
    }
    if (in_recent(addr)) {
      errno = saved_errno;
      return;  // retried on the new mapping
    }
  }
  errno = saved_errno;
  pass_on(sig, info, context);
}

// Puts our handler in front, keeping whatever is there now as the one to
// pass other faults to.
Result<void> install_handler() {
  struct sigaction current {};
  if (::sigaction(SIGSEGV, nullptr, &current) != 0) return fail(static_cast<std::errc>(errno));
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault) return {};
  struct sigaction ours {};
  ours.sa_sigaction = on_fault;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  previous_action = current;
  if (::sigaction(SIGSEGV, &ours, nullptr) != 0) return fail(static_cast<std::errc>(errno));
  installed.store(true, std::memory_order_release);
  return {};
}

}  // namespace

Result<void> WriteGuard::protect(uint64_t begin, uint64_t end) {
  if (auto ok = install_handler(); !ok) return ok;
  static uint32_t generation = 1;  // callers serialize; odd values only
  guard_begin.store(begin, std::memory_order_release);
  guard_end.store(end, std::memory_order_release);
  guard_state.store(generation, std::memory_order_release);
  generation += 2;
  if (::mprotect(reinterpret_cast<void*>(begin), end - begin, PROT_READ) != 0) {
    const int err = errno;
    guard_state.store(0, std::memory_order_release);
    return fail(static_cast<std::errc>(err));
  }
  return {};
}

void WriteGuard::release() {
  // Recorded before the state drops, so a late handler finds the range.
  const size_t slot = recent_next.fetch_add(1, std::memory_order_relaxed) % kRecent;
  recent[slot].released_ns.store(0, std::memory_order_release);  // void while it changes
  recent[slot].begin.store(guard_begin.load(std::memory_order_relaxed), std::memory_order_release);
  recent[slot].end.store(guard_end.load(std::memory_order_relaxed), std::memory_order_release);
  recent[slot].released_ns.store(now_ns(), std::memory_order_release);
  guard_state.store(0, std::memory_order_release);
  futex_wake_all(guard_state);
}

uint64_t WriteGuard::parked_faults() { return parked.load(std::memory_order_relaxed); }

}  // namespace softhca::host
