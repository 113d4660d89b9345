// A stream rsocket's connection: its descriptor, the rdma_cm steps of
// connect and accept, the CM events, shutdown and close.
#include "rsocket/stream_socket.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softhca::rsocket {

namespace {

constexpr int kResolveTimeoutMs = 2000;
constexpr int kMinBacklog = 128;

std::errc errc_from_errno(int err) { return static_cast<std::errc>(err != 0 ? err : EIO); }

std::errc last_errc() { return errc_from_errno(errno); }

Result<void> set_nonblocking_fd(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return fail(last_errc());
  return {};
}

socklen_t sockaddr_size(const sockaddr* addr) {
  return addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// What a failed connect reports, by the CM event that ended it.
int connect_errno(const rdma_cm_event& ev) {
  switch (ev.event) {
    case RDMA_CM_EVENT_REJECTED:
      return ECONNREFUSED;
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return ev.status == -ETIMEDOUT || ev.status == ETIMEDOUT ? ETIMEDOUT : EHOSTUNREACH;
    default:
      return ECONNABORTED;
  }
}

}  // namespace

StreamSocket::StreamSocket(int domain) : domain_(domain) {}

StreamSocket::~StreamSocket() { release_resources(); }

Result<std::shared_ptr<StreamSocket>> StreamSocket::create(int domain, int flags) {
  if (domain != AF_INET && domain != AF_INET6) return fail(std::errc::address_family_not_supported);
  std::shared_ptr<StreamSocket> s(new StreamSocket(domain));
  if (auto r = s->open_channel(flags); !r) return fail(r.error());
  if (rdma_create_id(s->channel_, &s->id_, s.get(), RDMA_PS_TCP) != 0) return fail(last_errc());
  return s;
}

// Every rsocket owns an event channel: its descriptor is the rsocket's
// number, and readable while a CM event waits. It is always non-blocking
// to us; O_NONBLOCK of the socket is our own flag.
Result<void> StreamSocket::open_channel(int flags) {
  channel_ = rdma_create_event_channel();
  if (channel_ == nullptr) return fail(last_errc());
  if (auto r = set_nonblocking_fd(channel_->fd); !r) return r;
  nonblocking_ = (flags & SOCK_NONBLOCK) != 0;
  fd_flags_ = (flags & SOCK_CLOEXEC) != 0 ? FD_CLOEXEC : 0;
  return {};
}

Result<void> StreamSocket::bind(const sockaddr* addr, socklen_t len) {
  std::lock_guard lock(mu_);
  if (addr == nullptr || len < sizeof(sockaddr_in)) return fail(std::errc::invalid_argument);
  if (state_ != State::kInit) return fail(std::errc::invalid_argument);
  if (rdma_bind_addr(id_, const_cast<sockaddr*>(addr)) != 0) return fail(last_errc());
  state_ = State::kBound;
  return {};
}

Result<void> StreamSocket::listen(int backlog) {
  std::lock_guard lock(mu_);
  if (state_ == State::kListening) return {};
  if (state_ != State::kInit && state_ != State::kBound) return fail(std::errc::invalid_argument);
  // A full CM backlog rejects a connect outright, where TCP would retry
  // the SYN; rdma-core's rsockets accept in a thread of their own and so
  // never fill it. We accept when the application does, so the backlog
  // is a floor, not a limit.
  if (rdma_listen(id_, std::max(backlog, kMinBacklog)) != 0) return fail(last_errc());
  state_ = State::kListening;
  return {};
}

Result<rdma_cm_event*> StreamSocket::next_connect_request_locked() {
  if (requests_.empty()) return fail(std::errc::resource_unavailable_try_again);
  rdma_cm_event* ev = requests_.front();
  requests_.pop_front();
  return ev;
}

Result<std::shared_ptr<StreamSocket>> StreamSocket::accept(int flags) {
  std::unique_lock lock(mu_);
  if (state_ != State::kListening) return fail(std::errc::invalid_argument);
  for (;;) {
    auto waited = wait_for(lock, nonblocking_, [&] { return !requests_.empty() || state_ != State::kListening; });
    if (!waited) return fail(waited.error());
    auto ev = next_connect_request_locked();
    if (!ev) return fail(std::errc::invalid_argument);  // no longer listening
    // The new socket inherits the listener's sizes and O_NONBLOCK, as in rdma-core.
    const StreamConfig inherited = config_;
    const int new_flags = flags | (nonblocking_ ? SOCK_NONBLOCK : 0);
    lock.unlock();
    auto accepted = accept_request(*ev, inherited, new_flags);
    // A request whose setup failed was rejected; a blocking accept waits
    // for the next one, as a TCP accept never sees such connections.
    if (accepted || (new_flags & SOCK_NONBLOCK) != 0) return accepted;
    lock.lock();
  }
}

// The passive side of one connection: its own event channel, the QP and
// buffers, and the reply carrying our buffer description.
Result<std::shared_ptr<StreamSocket>> StreamSocket::accept_request(rdma_cm_event* ev, const StreamConfig& config,
                                                                   int flags) {
  rdma_cm_id* id = ev->id;
  const std::optional<ConnData> peer = decode_conn_data(ev->param.conn.private_data, ev->param.conn.private_data_len);
  rdma_conn_param param = ev->param.conn;
  rdma_ack_cm_event(ev);
  auto reject = [&](std::errc why) -> Result<std::shared_ptr<StreamSocket>> {
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
    return fail(why);
  };
  if (!peer || (peer->flags & kConnFlagNet) != 0) return reject(std::errc::connection_aborted);

  std::shared_ptr<StreamSocket> s(new StreamSocket(domain_));
  s->config_ = config;
  if (auto r = s->open_channel(flags); !r) return reject(r.error());
  if (rdma_migrate_id(id, s->channel_) != 0) return reject(last_errc());
  id->context = s.get();
  s->id_ = id;

  // Until rdma_accept succeeds the id is not the new socket's: a failure
  // rejects and destroys it here, and the socket frees the rest.
  auto give_back_id = [&](std::errc why) {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    s->id_ = nullptr;
    return reject(why);
  };
  std::unique_lock lock(s->mu_);
  if (auto r = s->create_endpoint_locked(); !r) {
    lock.unlock();
    return give_back_id(r.error());
  }
  s->save_conn_data_locked(*peer);
  uint8_t reply[kConnDataSize];
  encode_conn_data(s->conn_data_locked(), reply);
  param.private_data = reply;
  param.private_data_len = sizeof reply;
  param.flow_control = 1;
  param.rnr_retry_count = 7;
  if (rdma_accept(id, &param) != 0) {
    const std::errc why = last_errc();
    lock.unlock();
    return give_back_id(why);
  }
  // The QP is ready to send once rdma_accept has moved it to RTS; the
  // ESTABLISHED event that follows changes nothing.
  s->state_ = State::kConnected;
  s->readable_ = s->writable_ = true;
  return s;
}

Result<void> StreamSocket::connect(const sockaddr* addr, socklen_t len) {
  std::unique_lock lock(mu_);
  switch (state_) {
    case State::kInit:
    case State::kBound: {
      if (addr == nullptr || len < sizeof(sockaddr_in) || len < sockaddr_size(addr) ||
          len > sizeof connect_dst_)
        return fail(std::errc::invalid_argument);
      std::memcpy(&connect_dst_, addr, sockaddr_size(addr));
      if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&connect_dst_), kResolveTimeoutMs) != 0) {
        const int err = errno;
        fail_connect_locked(err);
        return fail(errc_from_errno(err));
      }
      state_ = State::kResolvingAddr;
      break;
    }
    case State::kResolvingAddr:
    case State::kResolvingRoute:
    case State::kConnecting:
      if (nonblocking_) return fail(std::errc::connection_already_in_progress);
      break;
    case State::kConnected:
      return fail(std::errc::already_connected);
    case State::kConnectError: {
      const int err = error_;
      error_ = 0;
      return fail(errc_from_errno(err));
    }
    default:
      return fail(std::errc::invalid_argument);
  }
  auto connecting = [&] {
    return state_ == State::kResolvingAddr || state_ == State::kResolvingRoute || state_ == State::kConnecting;
  };
  auto waited = wait_for(lock, nonblocking_, [&] { return !connecting(); });
  if (!waited) {
    if (waited.error() == std::errc::resource_unavailable_try_again) return fail(std::errc::operation_in_progress);
    return waited;
  }
  if (state_ == State::kConnected) return {};
  const int err = error_;
  error_ = 0;
  return fail(errc_from_errno(err));
}

void StreamSocket::fail_connect_locked(int err) {
  state_ = State::kConnectError;
  error_ = err != 0 ? err : ECONNABORTED;
}

Result<void> StreamSocket::finish_connect_locked(const rdma_cm_event& ev) {
  const std::optional<ConnData> peer = decode_conn_data(ev.param.conn.private_data, ev.param.conn.private_data_len);
  if (!peer || (peer->flags & kConnFlagNet) != 0) return fail(std::errc::not_supported);
  save_conn_data_locked(*peer);
  state_ = State::kConnected;
  readable_ = writable_ = true;
  return {};
}

void StreamSocket::set_disconnected_locked() {
  state_ = State::kDisconnected;
  readable_ = writable_ = false;
}

void StreamSocket::handle_cm_events_locked() {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(channel_, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && state_ == State::kListening) {
      requests_.push_back(ev);  // acknowledged by accept, which reads its private data
      continue;
    }
    handle_cm_event_locked(*ev);
    rdma_ack_cm_event(ev);
  }
}

void StreamSocket::handle_cm_event_locked(rdma_cm_event& ev) {
  switch (ev.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (state_ != State::kResolvingAddr) return;
      if (rdma_resolve_route(id_, kResolveTimeoutMs) != 0) return fail_connect_locked(errno);
      state_ = State::kResolvingRoute;
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (state_ != State::kResolvingRoute) return;
      if (auto r = create_endpoint_locked(); !r) return fail_connect_locked(to_errno(r.error()));
      uint8_t request[kConnDataSize];
      encode_conn_data(conn_data_locked(), request);
      rdma_conn_param param{};
      param.private_data = request;
      param.private_data_len = sizeof request;
      param.responder_resources = 1;
      param.initiator_depth = 1;
      param.flow_control = 1;
      param.retry_count = 7;
      param.rnr_retry_count = 7;
      if (rdma_connect(id_, &param) != 0) return fail_connect_locked(errno);
      state_ = State::kConnecting;
      return;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (state_ != State::kConnecting) return;
      if (auto r = finish_connect_locked(ev); !r) {
        rdma_disconnect(id_);
        fail_connect_locked(to_errno(r.error()));
      }
      return;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
      if (state_ == State::kResolvingAddr || state_ == State::kResolvingRoute || state_ == State::kConnecting)
        fail_connect_locked(connect_errno(ev));
      else if (state_ == State::kConnected) {
        state_ = State::kError;
        error_ = ECONNRESET;
      }
      return;
    case RDMA_CM_EVENT_DISCONNECTED:
      // The CM's DREQ: the peer is gone or closed without (or after) its
      // disconnect message. Data already here can still be read.
      if (state_ == State::kConnected) set_disconnected_locked();
      return;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      state_ = State::kError;
      error_ = ENODEV;
      return;
    default:
      return;
  }
}

Result<void> StreamSocket::create_endpoint_locked() {
  ibv_device_attr attr{};
  uint16_t max_size = kQpMaxSize;
  if (ibv_query_device(id_->verbs, &attr) == 0)
    max_size = static_cast<uint16_t>(std::min<int>(attr.max_qp_wr, kQpMaxSize));
  config_.sq_size = std::clamp<uint16_t>(config_.sq_size, kQpMinSize, max_size);
  config_.rq_size = std::clamp<uint16_t>(config_.rq_size, kQpMinSize, max_size);

  comp_channel_ = ibv_create_comp_channel(id_->verbs);
  if (comp_channel_ == nullptr) return fail(last_errc());
  if (auto r = set_nonblocking_fd(comp_channel_->fd); !r) return r;
  cq_ = ibv_create_cq(id_->verbs, config_.sq_size + config_.rq_size, this, comp_channel_, 0);
  if (cq_ == nullptr) return fail(last_errc());

  ibv_qp_init_attr qp_attr{};
  qp_attr.qp_context = this;
  qp_attr.send_cq = cq_;
  qp_attr.recv_cq = cq_;
  qp_attr.qp_type = IBV_QPT_RC;
  qp_attr.sq_sig_all = 1;
  qp_attr.cap.max_send_wr = config_.sq_size;
  qp_attr.cap.max_recv_wr = config_.rq_size;
  qp_attr.cap.max_send_sge = 2;
  qp_attr.cap.max_recv_sge = 1;
  qp_attr.cap.max_inline_data = config_.inline_size;
  if (rdma_create_qp(id_, nullptr, &qp_attr) != 0) return fail(last_errc());
  sq_inline_ = qp_attr.cap.max_inline_data;

  if (auto r = init_buffers_locked(); !r) return r;
  for (uint32_t i = 0; i < config_.rq_size; ++i)
    if (auto r = post_recv_locked(); !r) return r;
  return {};
}

Result<void> StreamSocket::shutdown(int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(std::errc::invalid_argument);
  std::unique_lock lock(mu_);
  if (state_ != State::kConnected) {
    if (state_ == State::kDisconnected || state_ == State::kError) return {};
    return fail(std::errc::not_connected);
  }
  CtrlCode code;
  if (how == SHUT_RDWR) {
    code = CtrlCode::kDisconnect;
    readable_ = writable_ = false;
  } else if (how == SHUT_WR) {
    writable_ = false;
    code = readable_ ? CtrlCode::kShutdown : CtrlCode::kDisconnect;
  } else {
    readable_ = false;
    if (writable_) return {};
    code = CtrlCode::kDisconnect;
  }
  // Shutdown blocks whatever O_NONBLOCK says, as rdma-core's does: the
  // message must leave before the QP may go.
  if (auto r = send_ctrl_locked(lock, code); !r) return r;
  auto done = wait_for(lock, false, [&] { return all_sends_done_locked(); });
  if (code == CtrlCode::kDisconnect && state_ == State::kConnected) set_disconnected_locked();
  return done;
}

void StreamSocket::close() {
  bool connected;
  {
    std::lock_guard lock(mu_);
    connected = state_ == State::kConnected;
  }
  if (connected) (void)shutdown(SHUT_RDWR);
  release_resources();
}

void StreamSocket::release_resources() {
  std::lock_guard lock(mu_);
  for (rdma_cm_event* ev : requests_) {
    rdma_cm_id* id = ev->id;
    rdma_ack_cm_event(ev);
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
  }
  requests_.clear();
  if (id_ != nullptr && id_->qp != nullptr) {
    rdma_disconnect(id_);
    rdma_destroy_qp(id_);
  }
  if (cq_ != nullptr) {
    if (unacked_cq_events_ != 0) ibv_ack_cq_events(cq_, unacked_cq_events_);
    unacked_cq_events_ = 0;
    ibv_destroy_cq(cq_);
    cq_ = nullptr;
  }
  if (comp_channel_ != nullptr) {
    ibv_destroy_comp_channel(comp_channel_);
    comp_channel_ = nullptr;
  }
  for (IomapMapping& m : iomaps_) ibv_dereg_mr(m.mr);
  iomaps_.clear();
  for (ibv_mr** mr : {&smr_, &rmr_, &target_mr_}) {
    if (*mr != nullptr) ibv_dereg_mr(*mr);
    *mr = nullptr;
  }
  if (id_ != nullptr) {
    // Events of this id still queued must be acknowledged before it goes.
    rdma_cm_event* ev = nullptr;
    while (channel_ != nullptr && rdma_get_cm_event(channel_, &ev) == 0) rdma_ack_cm_event(ev);
    rdma_destroy_id(id_);
    id_ = nullptr;
  }
  if (channel_ != nullptr) {
    rdma_destroy_event_channel(channel_);
    channel_ = nullptr;
  }
}

Result<void> StreamSocket::local_address(sockaddr* addr, socklen_t* len) {
  std::lock_guard lock(mu_);
  if (addr == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
  const sockaddr* src = rdma_get_local_addr(id_);
  const socklen_t size = src->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(addr, src, std::min(size, *len));
  *len = size;
  return {};
}

Result<void> StreamSocket::peer_address(sockaddr* addr, socklen_t* len) {
  std::lock_guard lock(mu_);
  if (addr == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
  if (state_ != State::kConnected && state_ != State::kDisconnected) return fail(std::errc::not_connected);
  const sockaddr* dst = rdma_get_peer_addr(id_);
  const socklen_t size = dst->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(addr, dst, std::min(size, *len));
  *len = size;
  return {};
}

}  // namespace softhca::rsocket
