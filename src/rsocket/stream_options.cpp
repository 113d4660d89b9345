// A stream rsocket's options, file status flags and poll readiness.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>

#include <algorithm>
#include <cstring>

#include "rsocket/stream_socket.hpp"

namespace softhca::rsocket {

namespace {

Result<int> int_value(const void* value, socklen_t len) {
  if (value == nullptr || len < sizeof(int)) return fail(std::errc::invalid_argument);
  int v;
  std::memcpy(&v, value, sizeof v);
  return v;
}

Result<void> put_value(void* value, socklen_t* len, const void* data, socklen_t size) {
  if (value == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
  std::memcpy(value, data, std::min(*len, size));
  *len = std::min(*len, size);
  return {};
}

Result<void> put_int(void* value, socklen_t* len, int v) { return put_value(value, len, &v, sizeof v); }

}  // namespace

// Buffer and queue sizes take effect only before the connection exists,
// as in rdma-core; later they are accepted and ignored. Options a TCP
// socket has and an rsocket cannot honour (keepalive timing, congestion
// control) are remembered for getsockopt, or refused with ENOPROTOOPT.
Result<void> StreamSocket::set_option(int level, int name, const void* value, socklen_t len) {
  auto v = int_value(value, len);
  std::lock_guard lock(mu_);
  const bool sizes_open = cq_ == nullptr;
  switch (level) {
    case SOL_SOCKET:
      switch (name) {
        case SO_REUSEADDR:
          if (!v) return fail(v.error());
          reuse_addr_ = *v != 0;
          return {};
        case SO_SNDBUF:
        case SO_RCVBUF:
          if (!v) return fail(v.error());
          // Linux doubles the value for its bookkeeping; rdma-core doubles
          // it for the buffer.
          if (sizes_open && *v > 0) {
            const uint32_t size = std::max<uint32_t>(static_cast<uint32_t>(*v) << 1, 2 * kSendLowWater);
            (name == SO_SNDBUF ? config_.sbuf_size : config_.rbuf_size) = size;
          }
          return {};
        case SO_KEEPALIVE:
          if (!v) return fail(v.error());
          keepalive_ = *v != 0;
          return {};
        case SO_LINGER:
          if (value == nullptr || len < sizeof(linger)) return fail(std::errc::invalid_argument);
          std::memcpy(&linger_, value, sizeof linger_);
          return {};
        case SO_OOBINLINE:
        case SO_PRIORITY:
          return {};
        default:
          return fail(std::errc::no_protocol_option);
      }
    case IPPROTO_TCP:
      switch (name) {
        case TCP_NODELAY:
          if (!v) return fail(v.error());
          nodelay_ = *v != 0;  // every send goes out at once anyway
          return {};
        case TCP_KEEPIDLE:
          if (!v) return fail(v.error());
          if (*v <= 0) return fail(std::errc::invalid_argument);
          keepidle_ = *v;
          return {};
        case TCP_MAXSEG:
          return {};
        default:
          return fail(std::errc::no_protocol_option);
      }
    case IPPROTO_IPV6:
      if (name == IPV6_V6ONLY) {
        if (!v) return fail(v.error());
        int afonly = *v != 0;
        if (rdma_set_option(id_, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly, sizeof afonly) != 0)
          return fail(static_cast<std::errc>(errno));
        return {};
      }
      return fail(std::errc::no_protocol_option);
    case SOL_RDMA:
      if (name == RDMA_ROUTE) return {};  // our CM resolves the route itself
      if (!v) return fail(v.error());
      if (*v < 0) return fail(std::errc::invalid_argument);
      if (!sizes_open) return {};
      switch (name) {
        case RDMA_SQSIZE:
          config_.sq_size = static_cast<uint16_t>(std::min(*v, int{kQpMaxSize}));
          return {};
        case RDMA_RQSIZE:
          config_.rq_size = static_cast<uint16_t>(std::min(*v, int{kQpMaxSize}));
          return {};
        case RDMA_INLINE:
          config_.inline_size = static_cast<uint32_t>(*v);
          return {};
        case RDMA_IOMAPSIZE:
          config_.iomap_size = static_cast<uint32_t>(std::min(*v, 0xFF));
          return {};
        default:
          return fail(std::errc::no_protocol_option);
      }
    default:
      return fail(std::errc::no_protocol_option);
  }
}

Result<void> StreamSocket::get_option(int level, int name, void* value, socklen_t* len) {
  std::lock_guard lock(mu_);
  switch (level) {
    case SOL_SOCKET:
      switch (name) {
        case SO_ERROR: {
          const int err = error_;
          if (state_ == State::kConnectError) error_ = 0;
          return put_int(value, len, err);
        }
        case SO_TYPE:
          return put_int(value, len, SOCK_STREAM);
        case SO_DOMAIN:
          return put_int(value, len, domain_);
        case SO_PROTOCOL:
          return put_int(value, len, IPPROTO_TCP);
        case SO_ACCEPTCONN:
          return put_int(value, len, state_ == State::kListening);
        case SO_REUSEADDR:
          return put_int(value, len, reuse_addr_);
        case SO_KEEPALIVE:
          return put_int(value, len, keepalive_);
        case SO_SNDBUF:
          return put_int(value, len, static_cast<int>(config_.sbuf_size));
        case SO_RCVBUF:
          return put_int(value, len, static_cast<int>(config_.rbuf_size));
        case SO_LINGER:
          return put_value(value, len, &linger_, sizeof linger_);
        case SO_OOBINLINE:
          return put_int(value, len, 0);
        default:
          return fail(std::errc::no_protocol_option);
      }
    case IPPROTO_TCP:
      switch (name) {
        case TCP_NODELAY:
          return put_int(value, len, nodelay_);
        case TCP_MAXSEG:
          return put_int(value, len, static_cast<int>(kSendLowWater));
        case TCP_KEEPIDLE:
          return put_int(value, len, keepidle_);
        default:
          return fail(std::errc::no_protocol_option);
      }
    case SOL_RDMA:
      switch (name) {
        case RDMA_SQSIZE:
          return put_int(value, len, config_.sq_size);
        case RDMA_RQSIZE:
          return put_int(value, len, config_.rq_size);
        case RDMA_INLINE:
          return put_int(value, len, static_cast<int>(cq_ != nullptr ? sq_inline_ : config_.inline_size));
        case RDMA_IOMAPSIZE:
          return put_int(value, len, static_cast<int>(config_.iomap_size));
        default:
          return fail(std::errc::no_protocol_option);
      }
    default:
      return fail(std::errc::no_protocol_option);
  }
}

int StreamSocket::status_flags() {
  std::lock_guard lock(mu_);
  return O_RDWR | (nonblocking_ ? O_NONBLOCK : 0);
}

Result<void> StreamSocket::set_status_flags(int flags) {
  std::lock_guard lock(mu_);
  nonblocking_ = (flags & O_NONBLOCK) != 0;
  return {};
}

short StreamSocket::poll_events(short events) {
  std::lock_guard lock(mu_);
  progress_locked();
  short revents = 0;
  switch (state_) {
    case State::kListening:
      if (!requests_.empty()) revents |= POLLIN;
      break;
    case State::kConnectError:
      revents = static_cast<short>((events & (POLLIN | POLLOUT)) | POLLERR);
      break;
    case State::kConnected:
    case State::kDisconnected:
    case State::kError:
      if (have_rdata_locked() || !readable_) revents |= POLLIN;
      if (state_ == State::kConnected && writable_ && can_send_locked()) revents |= POLLOUT;
      // Hang-up only once the data that came before it has been read, as
      // TCP reports a FIN as readable first: a reader polling for POLLIN
      // gets its data, then EOF, then POLLHUP.
      if (state_ == State::kDisconnected && !have_rdata_locked()) revents |= POLLHUP;
      if (state_ == State::kError) revents |= POLLERR;
      break;
    default:
      break;
  }
  return static_cast<short>(revents & (events | POLLHUP | POLLERR));
}

int StreamSocket::wait_fds(pollfd (&out)[2]) {
  std::lock_guard lock(mu_);
  out[0] = pollfd{channel_->fd, POLLIN, 0};
  if (cq_ == nullptr) return 1;
  out[1] = pollfd{comp_channel_->fd, POLLIN, 0};
  return 2;
}

bool StreamSocket::arm() {
  std::lock_guard lock(mu_);
  if (cq_ == nullptr || cq_armed_) return false;
  ibv_req_notify_cq(cq_, 0);
  cq_armed_ = true;
  return true;
}

void StreamSocket::consume_wakeups() {
  std::lock_guard lock(mu_);
  // A sleeper holds wait_mu_ and will wake on this very event; taking it
  // from under it could leave it asleep (rdma-core's rpoll waits for its
  // cq_wait_lock for the same reason; we must not, holding mu_).
  std::unique_lock wait(wait_mu_, std::try_to_lock);
  if (wait.owns_lock()) take_cq_event_locked();
}

}  // namespace softhca::rsocket
