// Scatter-gather lists of this process (struct iovec): slicing and copying,
// used wherever a message's bytes are spread over several buffers.
#pragma once

#include <sys/uio.h>

#include <cstddef>

namespace softhca {

// The part [offset, offset + bytes) of the list `in` (n entries) into `out`
// (room for n entries); returns the number of entries written.
int slice_iovecs(const iovec* in, int n, size_t offset, size_t bytes, iovec* out);

// memmove between two iovec lists in this process, `bytes` at most.
void copy_iovecs(const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes);

}  // namespace softhca
