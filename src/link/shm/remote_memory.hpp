// Copies between this process and registered memory that a process (another
// or this one) could not move into its shared file: one process_vm_readv/writev
// call (single copy, no intermediate buffer, faults reported, not taken).
#pragma once

#include <sys/uio.h>

#include "common/iovec.hpp"

#include <cstddef>
#include <cstdint>

namespace softhca::shm {

enum class CopyResult { kOk, kFault, kGone };

// Scatter `src` (in this process) into `dst` (in process `pid`), `bytes` in total.
CopyResult write_to(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);
// Gather `src` (in process `pid`) into `dst` (in this process).
CopyResult read_from(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);

}  // namespace softhca::shm
