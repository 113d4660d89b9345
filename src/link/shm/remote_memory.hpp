// Copies between this process and another process's registered memory: memcpy
// when the target is this process, otherwise one process_vm_readv/writev call
// (single copy, no intermediate buffer).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace softhca::shm {

enum class CopyResult { kOk, kFault, kGone };

// Scatter `src` (in this process) into `dst` (in process `pid`), `bytes` in total.
CopyResult write_to(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);
// Gather `src` (in process `pid`) into `dst` (in this process).
CopyResult read_from(uint32_t pid, const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);

// The part [offset, offset + bytes) of the list `in` (n entries) into `out`
// (room for n entries); returns the number of entries written.
int slice_iovecs(const iovec* in, int n, size_t offset, size_t bytes, iovec* out);

// memcpy between two iovec lists in this process.
void copy_iovecs(const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);

}  // namespace softhca::shm
