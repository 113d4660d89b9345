#include "link/shm/remote_memory.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace softhca::shm {

namespace {

CopyResult from_errno(ssize_t done, size_t bytes) {
  if (done >= 0 && static_cast<size_t>(done) == bytes) return CopyResult::kOk;
  if (done < 0 && errno == ESRCH) return CopyResult::kGone;
  return CopyResult::kFault;
}

}  // namespace

// This process is reached the same way as another: through the kernel, so
// that an address the application unmapped after registering it is an
// EFAULT (kFault, an error completion), not a SIGSEGV in whichever thread
// copies. Registered memory in the shared file never comes here
// (ShmResponderPort::local_views); only what could not move does.
CopyResult write_to(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes) {
  if (bytes == 0) return CopyResult::kOk;
  const ssize_t done = ::process_vm_writev(static_cast<pid_t>(pid), src, static_cast<unsigned long>(nsrc), dst,
                                           static_cast<unsigned long>(ndst), 0);
  return from_errno(done, bytes);
}

CopyResult read_from(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes) {
  if (bytes == 0) return CopyResult::kOk;
  const ssize_t done = ::process_vm_readv(static_cast<pid_t>(pid), dst, static_cast<unsigned long>(ndst), src,
                                          static_cast<unsigned long>(nsrc), 0);
  return from_errno(done, bytes);
}

}  // namespace softhca::shm
