// softhca C++ API: the RDMA connection manager (librdmacm), RAII over
// <rdma/rdma_cma.h>.
//
// Not part of softhca.hpp: it needs librdmacm (link with -lrdmacm), which a
// verbs-only program does not. Same conventions as the verbs wrappers:
// X::create -> Expected<X>, X::make throws VerbsError, member calls return
// Expected and never throw, get() gives the raw object for anything not
// wrapped. Destruction order is the caller's: declare the EventChannel
// before the ids that use it, and acknowledge (destroy) a CmEvent before
// destroying the id it names.
//
//   auto ch = softhca::EventChannel::make();
//   auto id = softhca::CmId::make(ch);
//   auto dst = softhca::SocketAddress::make("127.0.0.1", 7471);
//   value_or_throw(id.resolve_addr(dst));
//   value_or_throw(ch.expect(RDMA_CM_EVENT_ADDR_RESOLVED));
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "error.hpp"
#include "handle.hpp"

namespace softhca {

enum class PortSpace { TCP = RDMA_PS_TCP, UDP = RDMA_PS_UDP, IB = RDMA_PS_IB, IPOIB = RDMA_PS_IPOIB };

// An IPv4 or IPv6 address and port, as the rdma_cm calls take them.
class SocketAddress {
 public:
  SocketAddress() = default;
  // A numeric host ("127.0.0.1", "::1"); EINVAL for anything else (no DNS).
  static Expected<SocketAddress> create(const std::string& host, std::uint16_t port) noexcept {
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_family = AF_UNSPEC;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr)
      return std::unexpected(Error(EINVAL, "getaddrinfo"));
    SocketAddress a;
    std::memcpy(&a.storage_, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return a;
  }
  static SocketAddress make(const std::string& host, std::uint16_t port) { return value_or_throw(create(host, port)); }

  sockaddr* get() noexcept { return reinterpret_cast<sockaddr*>(&storage_); }
  const sockaddr* get() const noexcept { return reinterpret_cast<const sockaddr*>(&storage_); }
  int family() const noexcept { return storage_.ss_family; }

 private:
  sockaddr_storage storage_{};
};

namespace detail {
struct EventChannelTraits {
  static constexpr const char* verb = "rdma_destroy_event_channel";
  static int destroy(rdma_event_channel* c) noexcept {
    rdma_destroy_event_channel(c);
    return 0;
  }
};
struct CmEventTraits {
  static constexpr const char* verb = "rdma_ack_cm_event";
  static int destroy(rdma_cm_event* e) noexcept { return rdma_ack_cm_event(e); }
};
struct CmIdTraits {
  static constexpr const char* verb = "rdma_destroy_id";
  // An id owns the QP rdma_create_qp gave it; librdmacm wants it gone first.
  static int destroy(rdma_cm_id* id) noexcept {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    return rdma_destroy_id(id);
  }
};
}  // namespace detail

// One event; destroying it acknowledges it (rdma_ack_cm_event).
class CmEvent : public detail::Handle<rdma_cm_event, detail::CmEventTraits> {
 public:
  using Handle::Handle;

  rdma_cm_event_type type() const noexcept { return get()->event; }
  const char* name() const noexcept { return rdma_event_str(get()->event); }
  int status() const noexcept { return get()->status; }
  // The id the event is about: for CONNECT_REQUEST a new id, which the
  // receiver adopts (CmId(event.id())) or rejects.
  rdma_cm_id* id() const noexcept { return get()->id; }
  rdma_cm_id* listen_id() const noexcept { return get()->listen_id; }
  // The peer's private data (connection events; the full message capacity,
  // zero-padded, as rdma_cm reports it).
  std::span<const std::byte> private_data() const noexcept {
    const auto& c = get()->param.conn;
    return {static_cast<const std::byte*>(c.private_data), c.private_data_len};
  }
};

class EventChannel : public detail::Handle<rdma_event_channel, detail::EventChannelTraits> {
 public:
  using Handle::Handle;

  static Expected<EventChannel> create() noexcept {
    errno = 0;
    auto c = detail::check_ptr(rdma_create_event_channel(), "rdma_create_event_channel");
    if (!c) return std::unexpected(c.error());
    return EventChannel(*c);
  }
  static EventChannel make() { return value_or_throw(create()); }

  // For poll/epoll.
  int fd() const noexcept { return get()->fd; }

  // The next event, waiting at most `timeout` (forever without one):
  // ETIMEDOUT when none came in time.
  Expected<CmEvent> get_event(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const noexcept {
    if (timeout) {
      pollfd p{fd(), POLLIN, 0};
      const int n = poll(&p, 1, static_cast<int>(timeout->count()));
      if (n == 0) return std::unexpected(Error(ETIMEDOUT, "rdma_get_cm_event"));
      if (n < 0) return std::unexpected(Error(detail::errno_or(EIO), "poll"));
    }
    rdma_cm_event* ev = nullptr;
    errno = 0;
    if (auto r = detail::check_rc(rdma_get_cm_event(get(), &ev), "rdma_get_cm_event"); !r)
      return std::unexpected(r.error());
    return CmEvent(ev);
  }

  // The next event, which must be `type` with status 0. Otherwise the error
  // says what came instead, as librdmacm's synchronous calls do: ECONNREFUSED
  // for REJECTED, the status as an errno for other failures (ETIMEDOUT for
  // UNREACHABLE after the CM's retries), EPROTO for a different event.
  Expected<CmEvent> expect(rdma_cm_event_type type,
                           std::optional<std::chrono::milliseconds> timeout = std::nullopt) const noexcept {
    auto ev = get_event(timeout);
    if (!ev) return ev;
    if (ev->type() == RDMA_CM_EVENT_REJECTED) return std::unexpected(Error(ECONNREFUSED, "rdma_connect"));
    if (ev->status() != 0)
      return std::unexpected(Error(ev->status() < 0 ? -ev->status() : ev->status(), "rdma_get_cm_event"));
    if (ev->type() != type) return std::unexpected(Error(EPROTO, "rdma_get_cm_event"));
    return ev;
  }
};

// rdma_conn_param without the raw pointer.
struct ConnParams {
  std::span<const std::byte> private_data;  // up to 56 bytes to connect, 196 to accept
  std::uint8_t responder_resources = 1;     // RDMA READs/atomics the peer may have outstanding at us
  std::uint8_t initiator_depth = 1;         // ... and we at the peer
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;         // 7: forever

  rdma_conn_param to_c() const noexcept {
    rdma_conn_param p{};
    p.private_data = private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    p.responder_resources = responder_resources;
    p.initiator_depth = initiator_depth;
    p.retry_count = retry_count;
    p.rnr_retry_count = rnr_retry_count;
    return p;
  }
};

class CmId : public detail::Handle<rdma_cm_id, detail::CmIdTraits> {
 public:
  using Handle::Handle;

  static Expected<CmId> create(const EventChannel& channel, PortSpace ps = PortSpace::TCP,
                               void* context = nullptr) noexcept {
    rdma_cm_id* id = nullptr;
    errno = 0;
    if (auto r = detail::check_rc(rdma_create_id(channel.get(), &id, context, static_cast<rdma_port_space>(ps)),
                                  "rdma_create_id");
        !r)
      return std::unexpected(r.error());
    return CmId(id);
  }
  static CmId make(const EventChannel& channel, PortSpace ps = PortSpace::TCP, void* context = nullptr) {
    return value_or_throw(create(channel, ps, context));
  }

  // The device context, default PD and QP rdma_cm gave the id (null before
  // the address is resolved, or before create_qp).
  ibv_context* verbs() const noexcept { return get()->verbs; }
  ibv_pd* pd() const noexcept { return get()->pd; }
  ibv_qp* qp() const noexcept { return get()->qp; }
  std::uint16_t src_port() const noexcept { return ntohs(rdma_get_src_port(get())); }

  Expected<void> bind(const SocketAddress& addr) const noexcept {
    return call(rdma_bind_addr(get(), const_cast<sockaddr*>(addr.get())), "rdma_bind_addr");
  }
  // ADDR_RESOLVED follows on the channel.
  Expected<void> resolve_addr(const SocketAddress& dst,
                              std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) const noexcept {
    return call(rdma_resolve_addr(get(), nullptr, const_cast<sockaddr*>(dst.get()), static_cast<int>(timeout.count())),
                "rdma_resolve_addr");
  }
  // ROUTE_RESOLVED follows on the channel.
  Expected<void> resolve_route(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) const noexcept {
    return call(rdma_resolve_route(get(), static_cast<int>(timeout.count())), "rdma_resolve_route");
  }
  Expected<void> listen(int backlog = 16) const noexcept { return call(rdma_listen(get(), backlog), "rdma_listen"); }

  // A QP on the id, moved through its states by the CM as connect/accept run.
  // pd: the id's default PD when null; CQs: made by librdmacm when
  // attr.send_cq / recv_cq are null.
  Expected<void> create_qp(ibv_qp_init_attr attr, ibv_pd* pd = nullptr) const noexcept {
    return call(rdma_create_qp(get(), pd, &attr), "rdma_create_qp");
  }

  Expected<void> connect(const ConnParams& params = {}) const noexcept {
    rdma_conn_param p = params.to_c();
    return call(rdma_connect(get(), &p), "rdma_connect");
  }
  Expected<void> accept(const ConnParams& params = {}) const noexcept {
    rdma_conn_param p = params.to_c();
    return call(rdma_accept(get(), &p), "rdma_accept");
  }
  Expected<void> reject(std::span<const std::byte> private_data = {}) const noexcept {
    return call(rdma_reject(get(), private_data.data(), static_cast<std::uint8_t>(private_data.size())), "rdma_reject");
  }
  Expected<void> disconnect() const noexcept { return call(rdma_disconnect(get()), "rdma_disconnect"); }

  // Work on the id's QP (see QueuePair for building work requests).
  Expected<void> post_send(ibv_send_wr& wr) const noexcept {
    ibv_send_wr* bad = nullptr;
    return detail::check_rc(ibv_post_send(qp(), &wr, &bad), "ibv_post_send");
  }
  Expected<void> post_recv(ibv_recv_wr& wr) const noexcept {
    ibv_recv_wr* bad = nullptr;
    return detail::check_rc(ibv_post_recv(qp(), &wr, &bad), "ibv_post_recv");
  }

 private:
  static Expected<void> call(int rc, const char* verb) noexcept {
    if (rc == 0) return {};
    return std::unexpected(Error(detail::errno_or(EIO), verb));
  }
};

}  // namespace softhca
