// Holds other threads' stores off a range of this process's memory while the
// range is re-backed (host/memory_backing.hpp), so that no store is lost.
//
// Re-backing copies the pages into a shared file and maps the file over them;
// a store another thread makes between the copy and the new mapping would
// land in the old page and vanish. So the range is write-protected first, in
// one of two ways:
//
// - userfaultfd write protection (Linux 6.4 and later, where the system call
//   is allowed): a thread that stores into the range waits inside its page
//   fault, in the kernel, whatever its signal mask, until release() wakes it;
//   the store then runs on the new mapping. With the full context (root, or
//   vm.unprivileged_userfaultfd=1) a system call writing into the range
//   (read(2) into a buffer being registered) waits too; with the user-mode
//   context unprivileged processes get, it fails with EFAULT.
// - otherwise mprotect: a thread that stores into it takes a SIGSEGV
//   (SEGV_ACCERR); our handler sees that the address is in the guarded range,
//   sleeps on a futex until the guard is released, and returns: the store
//   runs again, now on the new, writable mapping. A fault anywhere else goes
//   to the handler that was there before ours (or the default action), as if
//   we were not there. Limits, by nature of the method: a thread that blocks
//   SIGSEGV is killed by the kernel for such a store; a system call that
//   writes into the range fails with EFAULT; a handler installed after ours
//   that does not chain sees these faults (ours is put back in front at each
//   guard).
//
// Only whole pages of a registered range are ever guarded, never a partial
// page that holds other objects (memory_backing.hpp).
//
// The guard needs process-wide state, kept here and nowhere else: the
// userfaultfd, the guarded range and the few ranges guarded last (a thread
// can fault under a guard and reach the handler only after the release).
#pragma once

#include <cstdint>

#include "common/result.hpp"

namespace softhca::host {

class WriteGuard {
 public:
  // Makes [begin, end) (page-aligned) read-only and parks writers until
  // release(). One guard at a time in the process: callers serialize.
  // Errors: those of sigaction and mprotect (the range is left as it was).
  static Result<void> protect(uint64_t begin, uint64_t end);

  // Once the range has been replaced by writable memory: wakes the parked
  // threads, whose stores then run again.
  static void release();

  // When the range could not be replaced and holds its old pages still:
  // makes them writable again and wakes the parked threads.
  static void restore();

  // How many faults have been parked since the process started.
  static uint64_t parked_faults();

  // Whether guards use userfaultfd (else mprotect and the signal handler),
  // and whether system calls' writes wait too. For tests and `softhca stat`.
  enum class Method { kSignal, kUserFaultsOnly, kAllFaults };
  static Method method();
  // Tests: guard with mprotect and the handler even where userfaultfd works.
  static void use_signals_only(bool yes);
};

}  // namespace softhca::host
