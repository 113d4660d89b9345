// Holds other threads' stores off a range of this process's memory while the
// range is re-backed (host/memory_backing.hpp), so that no store is lost.
//
// Re-backing copies the pages into a shared file and maps the file over them;
// a store another thread makes between the copy and the new mapping would
// land in the old page and vanish. So the range is made read-only first. A
// thread that stores into it then takes a SIGSEGV (SEGV_ACCERR); our handler
// sees that the address is in the guarded range, sleeps on a futex until the
// guard is released, and returns: the store runs again, now on the new,
// writable mapping. A fault anywhere else goes to the handler that was there
// before ours (or the default action), as if we were not there.
//
// Limits, by nature of the method: a system call that writes into the range
// meanwhile (read(2) into a buffer being registered) fails with EFAULT
// instead of waiting; a handler installed after ours that does not chain
// sees these faults (ours is put back in front at each guard).
//
// The handler needs process-wide state, kept here and nowhere else: the
// guarded range and the few ranges guarded last (a thread can fault under a
// guard and reach the handler only after the release).
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

  // How many faults the handler has parked since the process started.
  static uint64_t parked_faults();
};

}  // namespace softhca::host
