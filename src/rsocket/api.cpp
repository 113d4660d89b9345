#include "rsocket/api.hpp"

#include <fcntl.h>
#include <netinet/in.h>

#include "rsocket/socket_table.hpp"

namespace softhca::rsocket {

namespace {

Result<std::shared_ptr<StreamSocket>> lookup(int fd) {
  auto s = find_socket(fd);
  if (!s) return fail(std::errc::bad_file_descriptor);
  return s;
}

}  // namespace

Result<int> socket(int domain, int type, int protocol) {
  const int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (kind != SOCK_STREAM) return fail(std::errc::not_supported);  // datagram rsockets: not yet
  if (protocol != 0 && protocol != IPPROTO_TCP) return fail(std::errc::protocol_not_supported);
  auto s = StreamSocket::create(domain, type & (SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!s) return fail(s.error());
  insert_socket(*s);
  return (*s)->fd();
}

Result<void> bind(int fd, const sockaddr* addr, socklen_t len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->bind(addr, len);
}

Result<void> listen(int fd, int backlog) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->listen(backlog);
}

Result<int> accept(int fd, sockaddr* addr, socklen_t* len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  auto accepted = (*s)->accept(0);
  if (!accepted) return fail(accepted.error());
  insert_socket(*accepted);
  if (addr != nullptr && len != nullptr) (void)(*accepted)->peer_address(addr, len);
  return (*accepted)->fd();
}

Result<void> connect(int fd, const sockaddr* addr, socklen_t len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->connect(addr, len);
}

Result<size_t> send(int fd, const iovec* iov, int iovcnt, int flags) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (iovcnt < 0 || (iov == nullptr && iovcnt != 0)) return fail(std::errc::invalid_argument);
  return (*s)->send(iov, iovcnt, flags);
}

Result<size_t> recv(int fd, const iovec* iov, int iovcnt, int flags, sockaddr* from, socklen_t* fromlen) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (iovcnt < 0 || (iov == nullptr && iovcnt != 0)) return fail(std::errc::invalid_argument);
  auto got = (*s)->recv(iov, iovcnt, flags);
  if (got && *got > 0 && from != nullptr && fromlen != nullptr) (void)(*s)->peer_address(from, fromlen);
  return got;
}

Result<void> shutdown(int fd, int how) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->shutdown(how);
}

Result<void> close(int fd) {
  auto s = remove_socket(fd);
  if (!s) return fail(std::errc::bad_file_descriptor);
  s->close();
  return {};
}

Result<void> local_address(int fd, sockaddr* addr, socklen_t* len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->local_address(addr, len);
}

Result<void> peer_address(int fd, sockaddr* addr, socklen_t* len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->peer_address(addr, len);
}

Result<void> set_option(int fd, int level, int name, const void* value, socklen_t len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->set_option(level, name, value, len);
}

Result<void> get_option(int fd, int level, int name, void* value, socklen_t* len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->get_option(level, name, value, len);
}

Result<int> fcntl(int fd, int cmd, long arg) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  switch (cmd) {
    case F_GETFL:
      return (*s)->status_flags();
    case F_SETFL:
      if (auto r = (*s)->set_status_flags(static_cast<int>(arg)); !r) return fail(r.error());
      return 0;
    case F_GETFD:
      return (*s)->descriptor_flags();
    case F_SETFD:
      (*s)->set_descriptor_flags(static_cast<int>(arg) & FD_CLOEXEC);
      return 0;
    default:
      return fail(std::errc::not_supported);
  }
}

Result<off_t> iomap(int fd, void* buf, size_t len, int prot, int flags, off_t offset) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (flags != 0) return fail(std::errc::invalid_argument);
  return (*s)->iomap(buf, len, prot, offset);
}

Result<void> iounmap(int fd, void* buf, size_t len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->iounmap(buf, len);
}

Result<size_t> iowrite(int fd, const void* buf, size_t count, off_t offset, int flags) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (buf == nullptr && count != 0) return fail(std::errc::invalid_argument);
  return (*s)->iowrite(buf, count, offset, flags);
}

}  // namespace softhca::rsocket
