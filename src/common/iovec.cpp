#include "common/iovec.hpp"

#include <cstring>

namespace softhca {

void copy_iovecs(const iovec* dst, int ndst, const iovec* src, int nsrc, size_t bytes) {
  int di = 0, si = 0;
  size_t doff = 0, soff = 0;
  while (bytes > 0 && di < ndst && si < nsrc) {
    const size_t davail = dst[di].iov_len - doff;
    const size_t savail = src[si].iov_len - soff;
    size_t n = davail < savail ? davail : savail;
    if (n > bytes) n = bytes;
    if (n > 0) std::memmove(static_cast<char*>(dst[di].iov_base) + doff, static_cast<const char*>(src[si].iov_base) + soff, n);
    doff += n;
    soff += n;
    bytes -= n;
    if (doff == dst[di].iov_len) {
      ++di;
      doff = 0;
    }
    if (soff == src[si].iov_len) {
      ++si;
      soff = 0;
    }
  }
}

int slice_iovecs(const iovec* in, int n, size_t offset, size_t bytes, iovec* out) {
  int count = 0;
  for (int i = 0; i < n && bytes > 0; ++i) {
    if (offset >= in[i].iov_len) {
      offset -= in[i].iov_len;
      continue;
    }
    size_t take = in[i].iov_len - offset;
    if (take > bytes) take = bytes;
    out[count++] = iovec{static_cast<char*>(in[i].iov_base) + offset, take};
    bytes -= take;
    offset = 0;
  }
  return count;
}

}  // namespace softhca
