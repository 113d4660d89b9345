#include "rsocket/api.hpp"

#include <fcntl.h>
#include <netinet/in.h>

#include "rsocket/datagram_socket.hpp"
#include "rsocket/socket_table.hpp"
#include "rsocket/stream_socket.hpp"

namespace softhca::rsocket {

namespace {

Result<std::shared_ptr<Socket>> lookup(int fd) {
  auto s = find_socket(fd);
  if (!s) return fail(std::errc::bad_file_descriptor);
  return s;
}

// The calls only one type has: a datagram rsocket answers EOPNOTSUPP to
// listen and accept as a UDP socket does, and to riomap.
Result<std::shared_ptr<StreamSocket>> lookup_stream(int fd) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if ((*s)->kind() != Socket::Kind::kStream) return fail(std::errc::operation_not_supported);
  return std::static_pointer_cast<StreamSocket>(*s);
}

DatagramSocket* as_datagram(const std::shared_ptr<Socket>& s) {
  return s->kind() == Socket::Kind::kDatagram ? static_cast<DatagramSocket*>(s.get()) : nullptr;
}

Result<void> check_iov(const iovec* iov, int iovcnt) {
  if (iovcnt < 0 || (iov == nullptr && iovcnt != 0)) return fail(std::errc::invalid_argument);
  return {};
}

}  // namespace

// As rdma-core: AF_INET and AF_INET6; SOCK_STREAM with protocol 0 or TCP,
// SOCK_DGRAM with 0 or UDP.
Result<int> socket(int domain, int type, int protocol) {
  const int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  const int flags = type & (SOCK_NONBLOCK | SOCK_CLOEXEC);
  std::shared_ptr<Socket> created;
  if (kind == SOCK_STREAM) {
    if (protocol != 0 && protocol != IPPROTO_TCP) return fail(std::errc::protocol_not_supported);
    auto s = StreamSocket::create(domain, flags);
    if (!s) return fail(s.error());
    created = *s;
  } else if (kind == SOCK_DGRAM) {
    if (protocol != 0 && protocol != IPPROTO_UDP) return fail(std::errc::protocol_not_supported);
    auto s = DatagramSocket::create(domain, flags);
    if (!s) return fail(s.error());
    created = *s;
  } else {
    return fail(std::errc::not_supported);
  }
  insert_socket(created);
  return created->fd();
}

Result<void> bind(int fd, const sockaddr* addr, socklen_t len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  return (*s)->bind(addr, len);
}

Result<void> listen(int fd, int backlog) {
  auto s = lookup_stream(fd);
  if (!s) return fail(s.error());
  return (*s)->listen(backlog);
}

Result<int> accept(int fd, sockaddr* addr, socklen_t* len) {
  auto s = lookup_stream(fd);
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
  return send_to(fd, iov, iovcnt, flags, nullptr, 0);
}

Result<size_t> send_to(int fd, const iovec* iov, int iovcnt, int flags, const sockaddr* dest, socklen_t dest_len) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (auto r = check_iov(iov, iovcnt); !r) return fail(r.error());
  if (DatagramSocket* d = as_datagram(*s)) return d->send(iov, iovcnt, flags, dest, dest_len);
  return static_cast<StreamSocket&>(**s).send(iov, iovcnt, flags);
}

Result<size_t> recv(int fd, const iovec* iov, int iovcnt, int flags, sockaddr* from, socklen_t* fromlen,
                    int* msg_flags) {
  auto s = lookup(fd);
  if (!s) return fail(s.error());
  if (auto r = check_iov(iov, iovcnt); !r) return fail(r.error());
  if (msg_flags != nullptr) *msg_flags = 0;
  if (DatagramSocket* d = as_datagram(*s)) return d->recv(iov, iovcnt, flags, from, fromlen, msg_flags);
  auto got = static_cast<StreamSocket&>(**s).recv(iov, iovcnt, flags);
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
  auto s = lookup_stream(fd);
  if (!s) return fail(s.error());
  if (flags != 0) return fail(std::errc::invalid_argument);
  return (*s)->iomap(buf, len, prot, offset);
}

Result<void> iounmap(int fd, void* buf, size_t len) {
  auto s = lookup_stream(fd);
  if (!s) return fail(s.error());
  return (*s)->iounmap(buf, len);
}

Result<size_t> iowrite(int fd, const void* buf, size_t count, off_t offset, int flags) {
  auto s = lookup_stream(fd);
  if (!s) return fail(s.error());
  if (buf == nullptr && count != 0) return fail(std::errc::invalid_argument);
  return (*s)->iowrite(buf, count, offset, flags);
}

}  // namespace softhca::rsocket
