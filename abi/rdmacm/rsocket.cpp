// rsockets: the entry points exist (every rdmacm example links rpoll, and
// BIND_NOW needs them all) and fail with ENOSYS until a later issue implements
// rsockets; no descriptor is ever an rsocket, so rpoll and rselect are poll(2)
// and select(2) on ordinary descriptors.
#include <rdma/rsocket.h>

#include <poll.h>
#include <sys/select.h>

#include <cerrno>

namespace {

int no_rsockets() {
  errno = ENOSYS;
  return -1;
}

}  // namespace

extern "C" {

int rsocket(int, int, int) { return no_rsockets(); }
int rbind(int, const sockaddr*, socklen_t) { return no_rsockets(); }
int rlisten(int, int) { return no_rsockets(); }
int raccept(int, sockaddr*, socklen_t*) { return no_rsockets(); }
int rconnect(int, const sockaddr*, socklen_t) { return no_rsockets(); }
int rshutdown(int, int) { return no_rsockets(); }
int rclose(int) { return no_rsockets(); }
ssize_t rrecv(int, void*, size_t, int) { return no_rsockets(); }
ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return no_rsockets(); }
ssize_t rrecvmsg(int, msghdr*, int) { return no_rsockets(); }
ssize_t rsend(int, const void*, size_t, int) { return no_rsockets(); }
ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return no_rsockets(); }
ssize_t rsendmsg(int, const msghdr*, int) { return no_rsockets(); }
ssize_t rread(int, void*, size_t) { return no_rsockets(); }
ssize_t rreadv(int, const iovec*, int) { return no_rsockets(); }
ssize_t rwrite(int, const void*, size_t) { return no_rsockets(); }
ssize_t rwritev(int, const iovec*, int) { return no_rsockets(); }
int rgetpeername(int, sockaddr*, socklen_t*) { return no_rsockets(); }
int rgetsockname(int, sockaddr*, socklen_t*) { return no_rsockets(); }
int rsetsockopt(int, int, int, const void*, socklen_t) { return no_rsockets(); }
int rgetsockopt(int, int, int, void*, socklen_t*) { return no_rsockets(); }
int rfcntl(int, int, ...) { return no_rsockets(); }
off_t riomap(int, void*, size_t, int, int, off_t) { return no_rsockets(); }
int riounmap(int, void*, size_t) { return no_rsockets(); }
size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = ENOSYS;
  return static_cast<size_t>(-1);
}

int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return ::poll(fds, nfds, timeout); }

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return ::select(nfds, readfds, writefds, exceptfds, timeout);
}

}  // extern "C"
