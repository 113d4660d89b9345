// What every rsocket offers the descriptor-level calls and rpoll, whatever
// its type: a stream rsocket (stream_socket.hpp) or a datagram rsocket
// (datagram_socket.hpp). Type-specific calls (listen, accept, riomap for
// streams; addressed sends for datagrams) go through kind().
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cstdint>

#include "common/result.hpp"

namespace softhca::rsocket {

// Queue and buffer sizes an rsocket starts with (rdma-core's defaults);
// options change them until the buffers exist.
struct QueueConfig {
  uint16_t sq_size = 384;
  uint16_t rq_size = 384;
  uint32_t inline_size = 64;
  uint32_t sbuf_size = 1u << 17;
  uint32_t rbuf_size = 1u << 17;
};

class Socket {
 public:
  enum class Kind { kStream, kDatagram };

  virtual ~Socket() = default;

  virtual Kind kind() const = 0;
  virtual int fd() const = 0;

  virtual Result<void> bind(const sockaddr* addr, socklen_t len) = 0;
  virtual Result<void> connect(const sockaddr* addr, socklen_t len) = 0;
  virtual Result<void> shutdown(int how) = 0;
  // Every resource goes (after an orderly shutdown where the type has one).
  virtual void close() = 0;

  virtual Result<void> local_address(sockaddr* addr, socklen_t* len) = 0;
  virtual Result<void> peer_address(sockaddr* addr, socklen_t* len) = 0;
  virtual Result<void> set_option(int level, int name, const void* value, socklen_t len) = 0;
  virtual Result<void> get_option(int level, int name, void* value, socklen_t* len) = 0;
  virtual int status_flags() = 0;  // F_GETFL
  virtual Result<void> set_status_flags(int flags) = 0;
  virtual int descriptor_flags() const = 0;
  virtual void set_descriptor_flags(int flags) = 0;

  // rpoll: readiness for `events` after nonblocking progress (0: none yet).
  virtual short poll_events(short events) = 0;
  // Before sleeping: arms the completion notification; true when it was
  // not armed, and readiness must then be checked once more.
  virtual bool arm() = 0;
  // The descriptors to sleep on until poll_events may change.
  virtual int wait_fds(pollfd (&out)[2]) = 0;
  // After poll(2) saw one of wait_fds readable: take the completion event,
  // unless a blocked call of another thread sleeps on it.
  virtual void consume_wakeups() = 0;
};

}  // namespace softhca::rsocket
