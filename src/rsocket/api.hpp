// The rsocket API (<rdma/rsocket.h>) as C++ functions with Result errors;
// abi/rdmacm/rsocket.cpp turns them into the C convention (-1 + errno).
#pragma once

#include <poll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>

#include "common/result.hpp"

namespace softhca::rsocket {

Result<int> socket(int domain, int type, int protocol);
Result<void> bind(int fd, const sockaddr* addr, socklen_t len);
Result<void> listen(int fd, int backlog);
Result<int> accept(int fd, sockaddr* addr, socklen_t* len);
Result<void> connect(int fd, const sockaddr* addr, socklen_t len);
Result<size_t> send(int fd, const iovec* iov, int iovcnt, int flags);
// A stream rsocket ignores dest, as send(2) on a connected TCP socket does.
Result<size_t> send_to(int fd, const iovec* iov, int iovcnt, int flags, const sockaddr* dest, socklen_t dest_len);
// msg_flags (optional): receives MSG_TRUNC when a datagram was cut short.
Result<size_t> recv(int fd, const iovec* iov, int iovcnt, int flags, sockaddr* from, socklen_t* fromlen,
                    int* msg_flags = nullptr);
Result<void> shutdown(int fd, int how);
Result<void> close(int fd);
Result<void> local_address(int fd, sockaddr* addr, socklen_t* len);
Result<void> peer_address(int fd, sockaddr* addr, socklen_t* len);
Result<void> set_option(int fd, int level, int name, const void* value, socklen_t len);
Result<void> get_option(int fd, int level, int name, void* value, socklen_t* len);
Result<int> fcntl(int fd, int cmd, long arg);
Result<off_t> iomap(int fd, void* buf, size_t len, int prot, int flags, off_t offset);
Result<void> iounmap(int fd, void* buf, size_t len);
Result<size_t> iowrite(int fd, const void* buf, size_t count, off_t offset, int flags);
// Any mix of rsockets and ordinary descriptors.
Result<int> poll(pollfd* fds, nfds_t nfds, int timeout_ms);
Result<int> select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout);

}  // namespace softhca::rsocket
