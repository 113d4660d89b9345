// rsockets (<rdma/rsocket.h>): each entry point translates to the rsocket
// layer (src/rsocket), which speaks rdma-core's rsocket protocol over our
// own rdma_cm and verbs. The C convention of every call is -1 + errno
// (riowrite: (size_t)-1 + errno); nothing thrown crosses this file.
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdarg>
#include <exception>

#include "rsocket/api.hpp"

namespace {

namespace rs = softhca::rsocket;

template <typename T>
T fail_with(std::errc code) {
  errno = softhca::to_errno(code);
  return static_cast<T>(-1);
}

// Result<void> -> 0, Result<int/size_t> -> the value; -1 + errno on error.
template <typename T, typename F>
T call(F&& f) noexcept {
  try {
    auto r = f();
    if (!r) return fail_with<T>(r.error());
    if constexpr (std::is_void_v<typename decltype(r)::value_type>)
      return 0;
    else
      return static_cast<T>(*r);
  } catch (const std::bad_alloc&) {
    return fail_with<T>(std::errc::not_enough_memory);
  } catch (...) {
    return fail_with<T>(std::errc::io_error);
  }
}

iovec one_iov(const void* buf, size_t len) { return iovec{const_cast<void*>(buf), len}; }

}  // namespace

extern "C" {

int rsocket(int domain, int type, int protocol) { return call<int>([&] { return rs::socket(domain, type, protocol); }); }

int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  return call<int>([&] { return rs::bind(socket, addr, addrlen); });
}

int rlisten(int socket, int backlog) { return call<int>([&] { return rs::listen(socket, backlog); }); }

int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  return call<int>([&] { return rs::accept(socket, addr, addrlen); });
}

int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  return call<int>([&] { return rs::connect(socket, addr, addrlen); });
}

int rshutdown(int socket, int how) { return call<int>([&] { return rs::shutdown(socket, how); }); }

int rclose(int socket) { return call<int>([&] { return rs::close(socket); }); }

ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  const iovec iov = one_iov(buf, len);
  return call<ssize_t>([&] { return rs::recv(socket, &iov, 1, flags, nullptr, nullptr); });
}

ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr, socklen_t* addrlen) {
  const iovec iov = one_iov(buf, len);
  return call<ssize_t>([&] { return rs::recv(socket, &iov, 1, flags, src_addr, addrlen); });
}

ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (msg == nullptr) return fail_with<ssize_t>(std::errc::invalid_argument);
  return call<ssize_t>([&] {
    return rs::recv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                    static_cast<sockaddr*>(msg->msg_name), msg->msg_name != nullptr ? &msg->msg_namelen : nullptr,
                    &msg->msg_flags);
  });
}

ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  const iovec iov = one_iov(buf, len);
  return call<ssize_t>([&] { return rs::send(socket, &iov, 1, flags); });
}

// A datagram rsocket sends to dest (or its connected peer when dest is
// NULL); a stream rsocket is connected and ignores dest, as send(2) does.
ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr, socklen_t addrlen) {
  const iovec iov = one_iov(buf, len);
  return call<ssize_t>([&] { return rs::send_to(socket, &iov, 1, flags, dest_addr, addrlen); });
}

ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (msg == nullptr) return fail_with<ssize_t>(std::errc::invalid_argument);
  return call<ssize_t>([&] {
    return rs::send_to(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                       static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
  });
}

ssize_t rread(int socket, void* buf, size_t count) { return rrecv(socket, buf, count, 0); }

ssize_t rreadv(int socket, const iovec* iov, int iovcnt) {
  return call<ssize_t>([&] { return rs::recv(socket, iov, iovcnt, 0, nullptr, nullptr); });
}

ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }

ssize_t rwritev(int socket, const iovec* iov, int iovcnt) {
  return call<ssize_t>([&] { return rs::send(socket, iov, iovcnt, 0); });
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  return call<int>([&] { return rs::peer_address(socket, addr, addrlen); });
}

int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  return call<int>([&] { return rs::local_address(socket, addr, addrlen); });
}

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  return call<int>([&] { return rs::set_option(socket, level, optname, optval, optlen); });
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  return call<int>([&] { return rs::get_option(socket, level, optname, optval, optlen); });
}

int rfcntl(int socket, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  const long arg = va_arg(args, long);
  va_end(args);
  return call<int>([&] { return rs::fcntl(socket, cmd, arg); });
}

int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return call<int>([&] { return rs::poll(fds, nfds, timeout); }); }

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return call<int>([&] { return rs::select(nfds, readfds, writefds, exceptfds, timeout); });
}

off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  return call<off_t>([&] { return rs::iomap(socket, buf, len, prot, flags, offset); });
}

int riounmap(int socket, void* buf, size_t len) { return call<int>([&] { return rs::iounmap(socket, buf, len); }); }

size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  return call<size_t>([&] { return rs::iowrite(socket, buf, count, offset, flags); });
}

}  // extern "C"
