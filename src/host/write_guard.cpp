#include "host/write_guard.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <sys/ioctl.h>
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

// Linux 6.4's flag, newer than Debian 12's headers: write protection covers
// pages never touched yet (else a store there would take a fresh page,
// unguarded, and be lost under the new mapping).
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
constexpr uint64_t kUffdFeatures = UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;

// The process's userfaultfd, opened at the first guard. Only guards touch it,
// and callers serialize guards. A forked child inherits the descriptor, but
// it names the parent's address space: the child opens its own.
struct FaultWaiter {
  int fd = -1;
  pid_t owner = 0;  // the process that opened fd
  WriteGuard::Method method = WriteGuard::Method::kSignal;
};
FaultWaiter waiter;
std::atomic<bool> signals_only{false};
bool guard_by_uffd = false;  // the guard up now

void open_waiter() {
  const pid_t self = ::getpid();
  if (waiter.owner == self) return;
  if (waiter.fd >= 0) ::close(waiter.fd);  // the parent's
  waiter = FaultWaiter{};
  waiter.owner = self;
  // The full context first (system calls' writes wait too), else the
  // user-mode one unprivileged processes may open.
  for (const int mode : {0, static_cast<int>(UFFD_USER_MODE_ONLY)}) {
    const int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | mode));
    if (fd < 0) continue;
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = kUffdFeatures;
    if (::ioctl(fd, UFFDIO_API, &api) == 0) {
      waiter.fd = fd;
      waiter.method = mode == 0 ? WriteGuard::Method::kAllFaults : WriteGuard::Method::kUserFaultsOnly;
      return;
    }
    const int err = errno;
    ::close(fd);
    if (err == EINVAL) return;  // a kernel without these features
  }
}

bool uffd_protect(uint64_t begin, uint64_t end) {
  uffdio_register reg{};
  reg.range.start = begin;
  reg.range.len = end - begin;
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (::ioctl(waiter.fd, UFFDIO_REGISTER, &reg) != 0) return false;  // the application's own, or a kind it refuses
  uffdio_writeprotect wp{};
  wp.range = reg.range;
  wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
  if (::ioctl(waiter.fd, UFFDIO_WRITEPROTECT, &wp) == 0) return true;
  ::ioctl(waiter.fd, UFFDIO_UNREGISTER, &reg.range);
  return false;
}

// Counts the faults waiting now; they stay parked until woken.
void count_waiting_faults() {
  uffd_msg msgs[16];
  for (;;) {
    const ssize_t n = ::read(waiter.fd, msgs, sizeof msgs);
    if (n <= 0) return;
    parked.fetch_add(static_cast<uint64_t>(n) / sizeof(uffd_msg), std::memory_order_relaxed);
  }
}

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
  open_waiter();
  guard_begin.store(begin, std::memory_order_release);
  guard_end.store(end, std::memory_order_release);
  guard_by_uffd = waiter.fd >= 0 && !signals_only.load(std::memory_order_relaxed) && uffd_protect(begin, end);
  if (guard_by_uffd) return {};
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
  if (guard_by_uffd) {
    // The range is a new mapping now (nothing registered there): the
    // parked threads retry their faults on it.
    count_waiting_faults();
    uffdio_range range{guard_begin.load(std::memory_order_relaxed),
                       guard_end.load(std::memory_order_relaxed) - guard_begin.load(std::memory_order_relaxed)};
    ::ioctl(waiter.fd, UFFDIO_WAKE, &range);
    guard_by_uffd = false;
    return;
  }
  // Recorded before the state drops, so a late handler finds the range.
  const size_t slot = recent_next.fetch_add(1, std::memory_order_relaxed) % kRecent;
  recent[slot].released_ns.store(0, std::memory_order_release);  // void while it changes
  recent[slot].begin.store(guard_begin.load(std::memory_order_relaxed), std::memory_order_release);
  recent[slot].end.store(guard_end.load(std::memory_order_relaxed), std::memory_order_release);
  recent[slot].released_ns.store(now_ns(), std::memory_order_release);
  guard_state.store(0, std::memory_order_release);
  futex_wake_all(guard_state);
}

void WriteGuard::restore() {
  const uint64_t begin = guard_begin.load(std::memory_order_relaxed);
  const uint64_t end = guard_end.load(std::memory_order_relaxed);
  if (guard_by_uffd) {
    count_waiting_faults();
    uffdio_writeprotect wp{};
    wp.range = uffdio_range{begin, end - begin};
    wp.mode = 0;  // write access back, and the parked threads woken
    ::ioctl(waiter.fd, UFFDIO_WRITEPROTECT, &wp);
    ::ioctl(waiter.fd, UFFDIO_UNREGISTER, &wp.range);
    guard_by_uffd = false;
    return;
  }
  ::mprotect(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE);
  release();
}

uint64_t WriteGuard::parked_faults() { return parked.load(std::memory_order_relaxed); }

WriteGuard::Method WriteGuard::method() {
  if (signals_only.load(std::memory_order_relaxed)) return Method::kSignal;
  open_waiter();
  return waiter.method;
}

void WriteGuard::use_signals_only(bool yes) { signals_only.store(yes, std::memory_order_relaxed); }

}  // namespace softhca::host
