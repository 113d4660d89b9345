// A datagram rsocket: its UDP socket and address service, its UD QPs and
// destinations, the data path and the waits (datagram_socket.hpp).
#include "rsocket/datagram_socket.hpp"

#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace softhca::rsocket {

namespace {

constexpr uint64_t kRecvWrId = uint64_t{1} << 63;
constexpr int kResolveTimeoutMs = 2000;
constexpr uint32_t kGrhSize = 40;  // sizeof(ibv_grh): in front of every UD receive
constexpr int kCloseDrainMs = 2000;
constexpr unsigned kAckBatch = 64;

std::errc last_errc() { return static_cast<std::errc>(errno != 0 ? errno : EIO); }

socklen_t sockaddr_size(int family) { return family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }

uint16_t port_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                 : reinterpret_cast<const sockaddr_in&>(a).sin_port;
}

void set_port(sockaddr_storage& a, uint16_t port_be) {
  if (a.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6&>(a).sin6_port = port_be;
  else
    reinterpret_cast<sockaddr_in&>(a).sin_port = port_be;
}

bool is_any(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr == htonl(INADDR_ANY);
  const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(a);
  return std::memcmp(&sin6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0;
}

// A caller's address as ours: the family must be the socket's and the
// length enough for it.
Result<sockaddr_storage> copy_address(const sockaddr* addr, socklen_t len, int domain) {
  if (addr == nullptr) return fail(std::errc::invalid_argument);
  if (len < sizeof(sa_family_t)) return fail(std::errc::invalid_argument);
  if (addr->sa_family != domain) return fail(std::errc::address_family_not_supported);
  if (len < sockaddr_size(domain)) return fail(std::errc::invalid_argument);
  sockaddr_storage out{};
  std::memcpy(&out, addr, sockaddr_size(domain));
  return out;
}

size_t iov_total(const iovec* iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

void gather(uint8_t* dst, const iovec* iov, int iovcnt) {
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    std::memcpy(dst, iov[i].iov_base, iov[i].iov_len);
    dst += iov[i].iov_len;
  }
}

// Copies up to the iovecs' room; returns the bytes copied.
size_t scatter(const uint8_t* src, size_t len, const iovec* iov, int iovcnt) {
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < len; ++i) {
    const size_t chunk = std::min(len - done, iov[i].iov_len);
    if (chunk == 0) continue;
    std::memcpy(iov[i].iov_base, src + done, chunk);
    done += chunk;
  }
  return done;
}

void copy_out_address(const sockaddr_storage& src, sockaddr* addr, socklen_t* len) {
  if (addr == nullptr || len == nullptr) return;
  const socklen_t size = sockaddr_size(src.ss_family);
  std::memcpy(addr, &src, std::min(*len, size));
  *len = size;
}

Result<int> int_value(const void* value, socklen_t len) {
  if (value == nullptr || len < sizeof(int)) return fail(std::errc::invalid_argument);
  int v;
  std::memcpy(&v, value, sizeof v);
  return v;
}

}  // namespace

DatagramSocket::DatagramSocket(int domain) : domain_(domain) {}

DatagramSocket::~DatagramSocket() { release_resources(); }

Result<std::shared_ptr<DatagramSocket>> DatagramSocket::create(int domain, int flags) {
  if (domain != AF_INET && domain != AF_INET6) return fail(std::errc::address_family_not_supported);
  std::shared_ptr<DatagramSocket> s(new DatagramSocket(domain));
  // The kernel socket stays blocking: we use it with MSG_DONTWAIT or after
  // poll(2); O_NONBLOCK of the rsocket is our own flag.
  s->udp_fd_ = ::socket(domain, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s->udp_fd_ < 0) return fail(last_errc());
  s->nonblocking_ = (flags & SOCK_NONBLOCK) != 0;
  s->fd_flags_ = (flags & SOCK_CLOEXEC) != 0 ? FD_CLOEXEC : 0;
  return s;
}

DatagramSocket::AddrKey DatagramSocket::key_of(const sockaddr_storage& addr) {
  AddrKey key{};
  key[0] = static_cast<uint8_t>(addr.ss_family);
  const uint16_t port = port_of(addr);
  std::memcpy(&key[2], &port, 2);
  if (addr.ss_family == AF_INET)
    std::memcpy(&key[4], &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, 4);
  else
    std::memcpy(&key[4], &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, 16);
  return key;
}

// Sizes as rdma-core's ds_set_qp_size: a queue entry per slot of buffer.
Result<void> DatagramSocket::init_endpoint_locked() {
  if (endpoint_ready_) return {};
  DatagramConfig& c = config_;
  c.sq_size = static_cast<uint16_t>(std::clamp<uint32_t>(c.sq_size, 2, kQpMaxSize));
  c.rq_size = static_cast<uint16_t>(std::clamp<uint32_t>(c.rq_size, 2, kQpMaxSize));
  c.rq_size = static_cast<uint16_t>(std::clamp<uint32_t>(c.rbuf_size / kDatagramSlotSize, 2, c.rq_size));
  c.sq_size = static_cast<uint16_t>(std::clamp<uint32_t>(c.sbuf_size / kDatagramSlotSize, 2, c.sq_size));
  c.rbuf_size = c.rq_size * kDatagramSlotSize;
  c.sbuf_size = c.sq_size * kDatagramSlotSize;
  if (!sbuf_.allocate(c.sbuf_size)) return fail(std::errc::not_enough_memory);
  free_slots_.clear();
  for (uint32_t i = c.sq_size; i-- > 0;) free_slots_.push_back(i);
  endpoint_ready_ = true;
  return {};
}

Result<void> DatagramSocket::bind(const sockaddr* addr, socklen_t len) {
  std::lock_guard lock(mu_);
  auto a = copy_address(addr, len, domain_);
  if (!a) return fail(a.error());
  if (auto r = init_endpoint_locked(); !r) return r;
  if (::bind(udp_fd_, addr, len) != 0) return fail(last_errc());
  return {};
}

Result<void> DatagramSocket::connect(const sockaddr* addr, socklen_t len) {
  std::lock_guard lock(mu_);
  auto a = copy_address(addr, len, domain_);
  if (!a) return fail(a.error());
  if (auto r = init_endpoint_locked(); !r) return r;
  if (::connect(udp_fd_, addr, len) != 0) return fail(last_errc());
  auto dest = get_dest_locked(*a);
  if (!dest) return fail(dest.error());
  conn_dest_ = *dest;
  return {};
}

Result<void> DatagramSocket::shutdown(int how) {
  std::lock_guard lock(mu_);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(std::errc::invalid_argument);
  if (conn_dest_ == nullptr) return fail(std::errc::not_connected);
  if (how != SHUT_WR) readable_ = false;
  if (how != SHUT_RD) writable_ = false;
  return {};
}

// Sends in flight finish first (they read our send slots), as rdma-core's
// ds_shutdown waits for them; a UD send always completes, but we bound it.
void DatagramSocket::close() {
  {
    std::unique_lock lock(mu_);
    readable_ = writable_ = false;
    if (endpoint_ready_)
      (void)wait_for(lock, false, [&] { return free_slots_.size() == config_.sq_size; }, kCloseDrainMs);
  }
  release_resources();
}

void DatagramSocket::release_resources() {
  std::lock_guard lock(mu_);
  received_.clear();
  partials_.clear();
  for (auto& [key, dest] : dests_)
    if (dest->ah != nullptr) ibv_destroy_ah(dest->ah);
  dests_.clear();
  conn_dest_ = nullptr;
  for (auto& qp : qps_) destroy_qp(*qp);
  qps_.clear();
  if (comp_channel_ != nullptr) ibv_destroy_comp_channel(comp_channel_);
  comp_channel_ = nullptr;
  if (udp_fd_ >= 0) ::close(udp_fd_);
  udp_fd_ = -1;
}

void DatagramSocket::destroy_qp(Qp& qp) {
  if (qp.id != nullptr && qp.id->qp != nullptr) rdma_destroy_qp(qp.id);
  if (qp.cq != nullptr) {
    if (qp.unacked_events != 0) ibv_ack_cq_events(qp.cq, qp.unacked_events);
    ibv_destroy_cq(qp.cq);
  }
  if (qp.smr != nullptr) ibv_dereg_mr(qp.smr);
  if (qp.rmr != nullptr) ibv_dereg_mr(qp.rmr);
  if (qp.id != nullptr) rdma_destroy_id(qp.id);
  qp.id = nullptr;
  qp.cq = nullptr;
  qp.smr = qp.rmr = nullptr;
}

// Our address toward dest: the UDP socket's (bound now if it is not yet,
// so that replies have a port to come back to), with the IP the kernel
// would route from when the socket is bound to the wildcard.
Result<sockaddr_storage> DatagramSocket::source_for_locked(const sockaddr_storage& dest) {
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (::getsockname(udp_fd_, reinterpret_cast<sockaddr*>(&local), &len) != 0) return fail(last_errc());
  if (port_of(local) == 0) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(domain_);
    if (::bind(udp_fd_, reinterpret_cast<sockaddr*>(&any), sockaddr_size(domain_)) != 0) return fail(last_errc());
    len = sizeof local;
    if (::getsockname(udp_fd_, reinterpret_cast<sockaddr*>(&local), &len) != 0) return fail(last_errc());
  }
  if (!is_any(local)) return local;
  const uint16_t port = port_of(local);
  const int probe = ::socket(domain_, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return fail(last_errc());
  Result<sockaddr_storage> out = fail(std::errc::host_unreachable);
  if (::connect(probe, reinterpret_cast<const sockaddr*>(&dest), sockaddr_size(domain_)) == 0) {
    len = sizeof local;
    if (::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      set_port(local, port);
      out = local;
    } else {
      out = fail(last_errc());
    }
  } else {
    out = fail(last_errc());
  }
  ::close(probe);
  return out;
}

Result<DatagramSocket::Dest*> DatagramSocket::get_dest_locked(const sockaddr_storage& addr) {
  const AddrKey key = key_of(addr);
  if (auto it = dests_.find(key); it != dests_.end()) return it->second.get();
  auto local = source_for_locked(addr);
  if (!local) return fail(local.error());
  auto qp = get_qp_locked(*local);
  if (!qp) return fail(qp.error());
  auto dest = std::make_unique<Dest>();
  dest->addr = addr;
  dest->qp = *qp;
  Dest* raw = dest.get();
  dests_.emplace(key, std::move(dest));
  return raw;
}

Result<DatagramSocket::Qp*> DatagramSocket::get_qp_locked(const sockaddr_storage& local) {
  const AddrKey key = key_of(local);
  for (auto& qp : qps_)
    if (key_of(qp->local) == key) return qp.get();
  return create_qp_locked(local);
}

Result<DatagramSocket::Qp*> DatagramSocket::create_qp_locked(const sockaddr_storage& local) {
  auto qp = std::make_unique<Qp>();
  qp->local = local;
  qp->header_len = static_cast<uint8_t>(encode_ds_header(local, qp->header));
  auto undo = [&](std::errc why) -> Result<Qp*> {
    destroy_qp(*qp);
    return fail(why);
  };
  if (rdma_create_id(nullptr, &qp->id, this, RDMA_PS_UDP) != 0) return fail(last_errc());
  // The rdma_cm picks the device for our address; the port is the UDP
  // socket's business (the header carries it), so the id takes any.
  sockaddr_storage bind_addr = local;
  set_port(bind_addr, 0);
  if (rdma_bind_addr(qp->id, reinterpret_cast<sockaddr*>(&bind_addr)) != 0) return undo(last_errc());
  if (qp->id->verbs == nullptr) return undo(std::errc::no_such_device);
  if (comp_channel_ == nullptr) {
    comp_channel_ = ibv_create_comp_channel(qp->id->verbs);
    if (comp_channel_ == nullptr) return undo(last_errc());
    const int fl = ::fcntl(comp_channel_->fd, F_GETFL);
    if (fl < 0 || ::fcntl(comp_channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) return undo(last_errc());
    verbs_ = qp->id->verbs;
  } else if (qp->id->verbs != verbs_) {
    return undo(std::errc::no_such_device);  // all QPs share one completion channel
  }
  const uint32_t sq = config_.sq_size;
  const uint32_t rq = config_.rq_size;
  qp->cq = ibv_create_cq(qp->id->verbs, static_cast<int>(sq + rq), qp.get(), comp_channel_, 0);
  if (qp->cq == nullptr) return undo(last_errc());

  ibv_qp_init_attr attr{};
  attr.qp_context = qp.get();
  attr.send_cq = qp->cq;
  attr.recv_cq = qp->cq;
  attr.qp_type = IBV_QPT_UD;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = sq;
  attr.cap.max_recv_wr = rq;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 2;
  attr.cap.max_inline_data = config_.inline_size;
  if (rdma_create_qp(qp->id, nullptr, &attr) != 0) return undo(last_errc());
  sq_inline_ = attr.cap.max_inline_data;

  ibv_port_attr port{};
  if (ibv_query_port(qp->id->verbs, qp->id->port_num != 0 ? qp->id->port_num : 1, &port) != 0)
    return undo(last_errc());
  const uint32_t mtu = 128u << std::clamp<int>(port.active_mtu, IBV_MTU_256, IBV_MTU_4096);
  qp->ud_mtu = std::min(mtu, kDatagramSlotSize);

  if (!qp->rbuf.allocate(size_t{rq} * kDatagramSlotSize + kGrhSize)) return undo(std::errc::not_enough_memory);
  qp->rmr = ibv_reg_mr(qp->id->pd, qp->rbuf.data(), qp->rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (qp->rmr == nullptr) return undo(last_errc());
  qp->smr = ibv_reg_mr(qp->id->pd, sbuf_.data(), sbuf_.size(), IBV_ACCESS_LOCAL_WRITE);
  if (qp->smr == nullptr) return undo(last_errc());
  for (uint32_t i = 0; i < rq; ++i)
    if (auto r = post_recv_locked(*qp, i * kDatagramSlotSize); !r) return undo(r.error());
  qps_.push_back(std::move(qp));
  cq_armed_ = false;
  return qps_.back().get();
}

// The GRH of every receive goes to one scratch area after the slots.
Result<void> DatagramSocket::post_recv_locked(Qp& qp, uint32_t offset) {
  ibv_sge sge[2];
  sge[0].addr = reinterpret_cast<uintptr_t>(qp.rbuf.data()) + size_t{config_.rq_size} * kDatagramSlotSize;
  sge[0].length = kGrhSize;
  sge[0].lkey = qp.rmr->lkey;
  sge[1].addr = reinterpret_cast<uintptr_t>(qp.rbuf.data()) + offset;
  sge[1].length = kDatagramSlotSize;
  sge[1].lkey = qp.rmr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvWrId | offset;
  wr.sg_list = sge;
  wr.num_sge = 2;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp.id->qp, &wr, &bad); rc != 0) return fail(static_cast<std::errc>(rc));
  return {};
}

// rdma-core's udp_svc_create_ah: the route to the peer's address from the
// QP's, resolved by the rdma_cm on an id of its own, into an AH.
void DatagramSocket::resolve_ah_locked(Dest& dest, uint32_t qpn) {
  if (dest.ah != nullptr) {
    ibv_destroy_ah(dest.ah);
    dest.ah = nullptr;
  }
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP) != 0) return;
  sockaddr_storage src = dest.qp->local;
  set_port(src, 0);
  sockaddr_storage dst = dest.addr;
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        kResolveTimeoutMs) == 0 &&
      rdma_resolve_route(id, kResolveTimeoutMs) == 0 && id->route.path_rec != nullptr) {
    const ibv_sa_path_rec& path = *id->route.path_rec;
    ibv_ah_attr attr{};
    if (path.hop_limit > 1) {
      attr.is_global = 1;
      attr.grh.dgid = path.dgid;
      attr.grh.flow_label = be32toh(path.flow_label);
      attr.grh.hop_limit = path.hop_limit;
      attr.grh.traffic_class = path.traffic_class;
      ibv_port_attr port{};
      const uint8_t port_num = dest.qp->id->port_num != 0 ? dest.qp->id->port_num : 1;
      const int gids = ibv_query_port(dest.qp->id->verbs, port_num, &port) == 0 ? port.gid_tbl_len : 0;
      for (int i = 0; i < gids; ++i) {
        ibv_gid gid;
        if (ibv_query_gid(dest.qp->id->verbs, port_num, i, &gid) == 0 &&
            std::memcmp(&gid, &path.sgid, sizeof gid) == 0) {
          attr.grh.sgid_index = static_cast<uint8_t>(i);
          break;
        }
      }
    }
    attr.dlid = be16toh(path.dlid);
    attr.sl = path.sl;
    attr.static_rate = path.rate;
    attr.port_num = id->port_num != 0 ? id->port_num : 1;
    dest.ah = ibv_create_ah(dest.qp->id->pd, &attr);
    if (dest.ah != nullptr) dest.qpn = qpn;
  }
  rdma_destroy_id(id);
}

Result<size_t> DatagramSocket::send_udp_locked(const Dest& dest, MsgOp op, const iovec* iov, int iovcnt, int flags) {
  uint8_t header[kDsUdpHeaderMaxLen];
  const size_t header_len = encode_ds_udp_header(op, dest.qp->id->qp->qp_num, dest.qp->local, header);
  std::vector<iovec> parts;
  parts.reserve(static_cast<size_t>(iovcnt) + 1);
  parts.push_back(iovec{header, header_len});
  for (int i = 0; i < iovcnt; ++i) parts.push_back(iov[i]);
  msghdr msg{};
  msg.msg_name = const_cast<sockaddr_storage*>(&dest.addr);
  msg.msg_namelen = sockaddr_size(dest.addr.ss_family);
  msg.msg_iov = parts.data();
  msg.msg_iovlen = parts.size();
  const ssize_t sent = ::sendmsg(udp_fd_, &msg, (flags & MSG_DONTWAIT) | MSG_NOSIGNAL);
  if (sent < 0) return fail(last_errc());
  return static_cast<size_t>(sent) - std::min(static_cast<size_t>(sent), header_len);
}

// rdma-core's address service, run inline: a peer that has no AH for us
// yet sends by UDP. We answer a data message with our QPN, make an AH for
// the peer, and queue the data; a control message only brings its QPN.
void DatagramSocket::serve_udp_locked() {
  if (udp_fd_ < 0 || !endpoint_ready_) return;
  uint8_t buf[kDsUdpHeaderMaxLen + kDatagramSlotSize];
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    // MSG_TRUNC: the real length, so that a datagram too large for any
    // sender of ours is skipped, not taken cut short.
    const ssize_t n = ::recvfrom(udp_fd_, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC,
                                 reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;  // EAGAIN, or an ICMP error for an earlier send: nothing to serve
    if (static_cast<size_t>(n) > sizeof buf) continue;
    const auto header = decode_ds_udp_header(buf, static_cast<size_t>(n), from.ss_family);
    if (!header) continue;
    auto dest = get_dest_locked(from);
    if (!dest) continue;
    if (header->op == MsgOp::kData) (void)send_udp_locked(**dest, MsgOp::kCtrl, nullptr, 0, MSG_DONTWAIT);
    if ((*dest)->ah == nullptr || (*dest)->qpn != header->qpn) resolve_ah_locked(**dest, header->qpn);
    if (header->op == MsgOp::kData) queue_copy_locked(buf + header->length, static_cast<size_t>(n) - header->length, from);
  }
}

void DatagramSocket::queue_copy_locked(const uint8_t* bytes, size_t len, const sockaddr_storage& src) {
  if (!readable_ || copied_queued_ >= config_.rq_size) return;  // full: dropped, as UDP drops
  Datagram d{nullptr, 0, nullptr, static_cast<uint32_t>(len), src, {}};
  d.copy.assign(bytes, bytes + len);
  d.payload = d.copy.data();
  received_.push_back(std::move(d));
  ++copied_queued_;
}

// Fragments of one sender QP come in order (one path); a gap or a new
// datagram's first fragment drops what was gathered, as UDP drops a
// datagram with a lost fragment.
void DatagramSocket::take_fragment_locked(Qp& qp, uint32_t src_qp, const FragHeader& frag, const uint8_t* bytes,
                                          size_t len) {
  const auto key = std::make_pair(&qp, src_qp);
  auto it = partials_.find(key);
  if (frag.index == 0) {
    const auto header = decode_ds_header(bytes, len);
    if (!header) {
      if (it != partials_.end()) partials_.erase(it);
      return;
    }
    Partial& p = partials_[key];
    p = Partial{frag.id, 1, frag.count, frag.total, header->src, {}};
    p.data.assign(bytes + header->length, bytes + len);
    it = partials_.find(key);
  } else {
    if (it == partials_.end()) return;
    Partial& p = it->second;
    if (p.id != frag.id || p.next != frag.index || p.count != frag.count) {
      partials_.erase(it);
      return;
    }
    p.data.insert(p.data.end(), bytes, bytes + len);
    ++p.next;
  }
  Partial& p = it->second;
  if (p.data.size() > p.total) {
    partials_.erase(it);
  } else if (p.next == p.count) {
    if (p.data.size() == p.total) queue_copy_locked(p.data.data(), p.data.size(), p.src);
    partials_.erase(it);
  }
}

void DatagramSocket::poll_cqs_locked() {
  for (auto& qp : qps_) {
    ibv_wc wcs[32];
    int n;
    while ((n = ibv_poll_cq(qp->cq, 32, wcs)) > 0) {
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        if ((wc.wr_id & kRecvWrId) == 0) {
          free_slots_.push_back(static_cast<uint32_t>(wc.wr_id));
          continue;
        }
        const auto offset = static_cast<uint32_t>(wc.wr_id & ~kRecvWrId);
        const uint8_t* slot = qp->rbuf.data() + offset;
        if (wc.status == IBV_WC_WR_FLUSH_ERR) continue;  // the QP goes away
        const size_t bytes = wc.status == IBV_WC_SUCCESS && wc.byte_len >= kGrhSize
                                 ? std::min<size_t>(wc.byte_len - kGrhSize, kDatagramSlotSize)
                                 : 0;
        if (const auto frag = decode_frag_header(slot, bytes)) {
          take_fragment_locked(*qp, wc.src_qp, *frag, slot + kFragHeaderLen, bytes - kFragHeaderLen);
          (void)post_recv_locked(*qp, offset);
          continue;
        }
        const auto header = decode_ds_header(slot, bytes);
        if (!header || !readable_) {
          // Failed, malformed, or not wanted: the slot goes straight back.
          (void)post_recv_locked(*qp, offset);
          continue;
        }
        const auto length = static_cast<uint32_t>(bytes - header->length);
        received_.push_back(Datagram{qp.get(), offset, slot + header->length, length, header->src, {}});
      }
    }
  }
}

void DatagramSocket::progress_locked() {
  poll_cqs_locked();
  serve_udp_locked();
}

void DatagramSocket::arm_locked() {
  for (auto& qp : qps_) {
    if (qp->armed) continue;
    ibv_req_notify_cq(qp->cq, 0);
    qp->armed = true;
  }
  cq_armed_ = true;
}

void DatagramSocket::take_cq_events_locked() {
  if (comp_channel_ == nullptr) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(comp_channel_, &cq, &context) == 0) {
    auto* qp = static_cast<Qp*>(context);
    qp->armed = false;
    cq_armed_ = false;
    if (++qp->unacked_events >= kAckBatch) {
      ibv_ack_cq_events(qp->cq, qp->unacked_events);
      qp->unacked_events = 0;
    }
  }
}

Result<void> DatagramSocket::wait_for(std::unique_lock<std::mutex>& lock, bool nonblocking,
                                      const std::function<bool()>& test, int timeout_ms) {
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    progress_locked();
    if (test()) return {};
    if (nonblocking) return fail(std::errc::resource_unavailable_try_again);
    if (!cq_armed_) {
      // Arm, then look once more: a completion before the arm raises no event.
      arm_locked();
      continue;
    }
    int sleep_ms = -1;
    if (timeout_ms >= 0) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      const int64_t spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
      if (spent >= timeout_ms) return fail(std::errc::timed_out);
      sleep_ms = static_cast<int>(timeout_ms - spent);
    }
    {
      std::unique_lock wait(wait_mu_);
      pollfd fds[2] = {{udp_fd_, POLLIN, 0}, {comp_channel_ != nullptr ? comp_channel_->fd : -1, POLLIN, 0}};
      lock.unlock();
      // Another thread took the CQ event meanwhile: look again instead.
      if (cq_armed_) ::poll(fds, 2, sleep_ms);
    }
    lock.lock();
    take_cq_events_locked();
  }
}

Result<size_t> DatagramSocket::send(const iovec* iov, int iovcnt, int flags, const sockaddr* dest_addr,
                                    socklen_t dest_len) {
  std::unique_lock lock(mu_);
  if (!writable_) return fail(std::errc::broken_pipe);
  if (auto r = init_endpoint_locked(); !r) return fail(r.error());
  Dest* dest = conn_dest_;
  if (dest_addr != nullptr) {
    auto a = copy_address(dest_addr, dest_len, domain_);
    if (!a) return fail(a.error());
    auto d = get_dest_locked(*a);
    if (!d) return fail(d.error());
    dest = *d;
  }
  if (dest == nullptr) return fail(std::errc::destination_address_required);
  const size_t len = iov_total(iov, iovcnt);
  if (len > kDatagramSlotSize - dest->qp->header_len) return fail(std::errc::message_size);
  if (dest->ah == nullptr) {
    serve_udp_locked();  // the peer's QPN may be waiting there
    if (dest->ah == nullptr) return send_udp_locked(*dest, MsgOp::kData, iov, iovcnt, flags);
  }
  if (dest->qp->header_len + len > dest->qp->ud_mtu) return send_fragments_locked(lock, dest, iov, iovcnt, len, flags);

  if (!can_send_locked()) {
    auto waited = wait_for(lock, nonblocking(flags), [&] { return can_send_locked() || !writable_; });
    if (!waited) return fail(waited.error());
    if (!writable_) return fail(std::errc::broken_pipe);
  }
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  uint8_t* msg = sbuf_.data() + size_t{slot} * kDatagramSlotSize;
  std::memcpy(msg, dest->qp->header, dest->qp->header_len);
  gather(msg + dest->qp->header_len, iov, iovcnt);
  ibv_sge sge{reinterpret_cast<uintptr_t>(msg), static_cast<uint32_t>(dest->qp->header_len + len), dest->qp->smr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = sge.length <= sq_inline_ ? IBV_SEND_INLINE : 0;
  wr.wr.ud.ah = dest->ah;
  wr.wr.ud.remote_qpn = dest->qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(dest->qp->id->qp, &wr, &bad); rc != 0) {
    free_slots_.push_back(slot);
    return fail(static_cast<std::errc>(rc));
  }
  return len;
}

Result<size_t> DatagramSocket::send_fragments_locked(std::unique_lock<std::mutex>& lock, Dest*& dest,
                                                     const iovec* iov, int iovcnt, size_t len, int flags) {
  Qp& qp = *dest->qp;
  const size_t first_room = qp.ud_mtu - kFragHeaderLen - qp.header_len;
  const size_t room = qp.ud_mtu - kFragHeaderLen;
  const size_t count = 1 + (len - first_room + room - 1) / room;
  if (free_slots_.size() < count) {
    auto waited = wait_for(lock, nonblocking(flags), [&] { return free_slots_.size() >= count || !writable_; });
    if (!waited) return fail(waited.error());
    if (!writable_) return fail(std::errc::broken_pipe);
  }
  uint8_t flat[kDatagramSlotSize];
  gather(flat, iov, iovcnt);
  const FragHeader base{static_cast<uint16_t>(len), next_frag_id_++, 0, static_cast<uint8_t>(count)};
  const uint8_t version = qp.local.ss_family == AF_INET6 ? 6 : 4;
  std::vector<ibv_sge> sges(count);
  std::vector<ibv_send_wr> wrs(count);
  size_t done = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    uint8_t* msg = sbuf_.data() + size_t{slot} * kDatagramSlotSize;
    FragHeader h = base;
    h.index = static_cast<uint8_t>(i);
    uint8_t frag[kFragHeaderLen];
    encode_frag_header(h, version, frag);
    size_t at = 0;
    std::memcpy(msg, frag, kFragHeaderLen);
    at += kFragHeaderLen;
    if (i == 0) {
      std::memcpy(msg + at, qp.header, qp.header_len);
      at += qp.header_len;
    }
    const size_t chunk = std::min(len - done, i == 0 ? first_room : room);
    std::memcpy(msg + at, flat + done, chunk);
    done += chunk;
    sges[i] = ibv_sge{reinterpret_cast<uintptr_t>(msg), static_cast<uint32_t>(at + chunk), qp.smr->lkey};
    ibv_send_wr& wr = wrs[i];
    wr = ibv_send_wr{};
    wr.wr_id = slot;
    wr.next = i + 1 < count ? &wrs[i + 1] : nullptr;
    wr.sg_list = &sges[i];
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = sges[i].length <= sq_inline_ ? IBV_SEND_INLINE : 0;
    wr.wr.ud.ah = dest->ah;
    wr.wr.ud.remote_qpn = dest->qpn;
    wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp.id->qp, wrs.data(), &bad); rc != 0) {
    // The WRs from bad on were not posted: their slots are free again.
    for (ibv_send_wr* w = bad; w != nullptr; w = w->next) free_slots_.push_back(static_cast<uint32_t>(w->wr_id));
    if (bad == wrs.data()) return fail(static_cast<std::errc>(rc));
  }
  return len;
}

Result<size_t> DatagramSocket::recv(const iovec* iov, int iovcnt, int flags, sockaddr* from, socklen_t* fromlen,
                                    int* msg_flags) {
  std::unique_lock lock(mu_);
  // As rdma-core: a socket never bound, connected or sent from has no
  // address for anything to arrive at.
  if (!endpoint_ready_) return fail(std::errc::invalid_argument);
  if (received_.empty()) {
    auto waited = wait_for(lock, nonblocking(flags), [&] { return !received_.empty() || !readable_; });
    if (!waited) return fail(waited.error());
  }
  if (received_.empty()) return 0;  // shut down for reading
  Datagram& d = received_.front();
  const size_t copied = scatter(d.payload, d.length, iov, iovcnt);
  copy_out_address(d.src, from, fromlen);
  const size_t length = d.length;
  if (copied < length && msg_flags != nullptr) *msg_flags |= MSG_TRUNC;
  if ((flags & MSG_PEEK) == 0) {
    if (d.qp != nullptr) {
      (void)post_recv_locked(*d.qp, d.slot_offset);
    } else {
      --copied_queued_;
    }
    received_.pop_front();
  }
  return (flags & MSG_TRUNC) != 0 ? length : copied;
}

Result<void> DatagramSocket::local_address(sockaddr* addr, socklen_t* len) {
  if (addr == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
  std::lock_guard lock(mu_);
  if (::getsockname(udp_fd_, addr, len) != 0) return fail(last_errc());
  return {};
}

Result<void> DatagramSocket::peer_address(sockaddr* addr, socklen_t* len) {
  if (addr == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
  std::lock_guard lock(mu_);
  if (::getpeername(udp_fd_, addr, len) != 0) return fail(last_errc());
  return {};
}

// Socket-level options go to the UDP socket, as in rdma-core; the buffer
// sizes also size our queues until the socket first has an address (bind,
// connect or a send). SOL_RDMA sets the queue sizes and the inline limit,
// also only until then.
Result<void> DatagramSocket::set_option(int level, int name, const void* value, socklen_t len) {
  std::lock_guard lock(mu_);
  const bool sizes_open = !endpoint_ready_;
  if (level == SOL_RDMA) {
    auto v = int_value(value, len);
    if (!v) return fail(v.error());
    if (*v <= 0) return fail(std::errc::invalid_argument);
    switch (name) {
      case RDMA_SQSIZE:
        if (sizes_open) config_.sq_size = static_cast<uint16_t>(std::min<int>(*v, kQpMaxSize));
        return {};
      case RDMA_RQSIZE:
        if (sizes_open) config_.rq_size = static_cast<uint16_t>(std::min<int>(*v, kQpMaxSize));
        return {};
      case RDMA_INLINE:
        if (sizes_open) config_.inline_size = static_cast<uint32_t>(*v);
        return {};
      default:
        return fail(std::errc::no_protocol_option);
    }
  }
  if (::setsockopt(udp_fd_, level, name, value, len) != 0) return fail(last_errc());
  if (level == SOL_SOCKET && (name == SO_SNDBUF || name == SO_RCVBUF)) {
    auto v = int_value(value, len);
    if (v && *v > 0 && sizes_open) {
      const uint32_t size = std::max<uint32_t>(static_cast<uint32_t>(*v) << 1, 2 * kDatagramSlotSize);
      (name == SO_SNDBUF ? config_.sbuf_size : config_.rbuf_size) = size;
    }
  }
  return {};
}

Result<void> DatagramSocket::get_option(int level, int name, void* value, socklen_t* len) {
  std::lock_guard lock(mu_);
  if (level == SOL_RDMA) {
    int v;
    switch (name) {
      case RDMA_SQSIZE: v = config_.sq_size; break;
      case RDMA_RQSIZE: v = config_.rq_size; break;
      case RDMA_INLINE: v = static_cast<int>(qps_.empty() ? config_.inline_size : sq_inline_); break;
      default: return fail(std::errc::no_protocol_option);
    }
    if (value == nullptr || len == nullptr) return fail(std::errc::invalid_argument);
    std::memcpy(value, &v, std::min<socklen_t>(*len, sizeof v));
    *len = std::min<socklen_t>(*len, sizeof v);
    return {};
  }
  if (::getsockopt(udp_fd_, level, name, value, len) != 0) return fail(last_errc());
  return {};
}

int DatagramSocket::status_flags() {
  std::lock_guard lock(mu_);
  return O_RDWR | (nonblocking_ ? O_NONBLOCK : 0);
}

Result<void> DatagramSocket::set_status_flags(int flags) {
  std::lock_guard lock(mu_);
  nonblocking_ = (flags & O_NONBLOCK) != 0;
  return {};
}

short DatagramSocket::poll_events(short events) {
  std::lock_guard lock(mu_);
  progress_locked();
  short revents = 0;
  if (!received_.empty() || !readable_) revents |= POLLIN;
  // Before the first send there is no send queue yet, and room in it.
  if (writable_ && (!endpoint_ready_ || can_send_locked())) revents |= POLLOUT;
  return static_cast<short>(revents & events);
}

int DatagramSocket::wait_fds(pollfd (&out)[2]) {
  std::lock_guard lock(mu_);
  out[0] = pollfd{udp_fd_, POLLIN, 0};
  if (comp_channel_ == nullptr) return 1;
  out[1] = pollfd{comp_channel_->fd, POLLIN, 0};
  return 2;
}

bool DatagramSocket::arm() {
  std::lock_guard lock(mu_);
  if (qps_.empty() || cq_armed_) return false;
  arm_locked();
  return true;
}

void DatagramSocket::consume_wakeups() {
  std::lock_guard lock(mu_);
  std::unique_lock wait(wait_mu_, std::try_to_lock);
  if (wait.owns_lock()) take_cq_events_locked();
}

}  // namespace softhca::rsocket
