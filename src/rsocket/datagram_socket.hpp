// A datagram rsocket (SOCK_DGRAM), as rdma-core's librdmacm makes one:
// datagrams travel over UD QPs, each prefixed with a header naming the
// sender's address (datagram_protocol.hpp), and a kernel UDP socket serves
// as the rsocket's descriptor, its address (bind, connect, getsockname) and
// its address service.
//
// A destination is first reached through the UDP socket: the message goes
// there with a header carrying our QPN. The receiver answers with its own
// QPN (MsgOp::kCtrl), resolves the sender's address with the rdma_cm into
// an address handle, and delivers the message; from then on both sides
// send over their UD QPs. rdma-core runs that service in a thread of its
// own and forwards the message to itself through its QP; we serve the UDP
// socket wherever the rsocket makes progress (every call, rpoll, and a
// blocked call, which sleeps on the UDP socket too) and queue the message
// directly. A datagram larger than one UD message (the path MTU) crosses
// the QP in fragments (our extension, datagram_protocol.hpp): rdma-core
// loses such a datagram, and sending it by UDP instead would let it
// overtake or fall behind its neighbours on the QP.
//
// There is one UD QP per local address (rdma-core's ds_qp), bound with the
// rdma_cm; each has its CQ, all on one completion channel. Received
// datagrams stay in the QP's receive slots until read.
//
// Locking: as StreamSocket. mu_ guards all state; a thread that sleeps
// takes wait_mu_ before it lets go of mu_ and sleeps in poll(2) on the UDP
// socket and the completion channel, after arming every CQ under mu_.
// Address resolution (rdma_resolve_addr/route for a new peer) runs under
// mu_, as rdma-core's service thread holds its lock for it.
// Order: mu_ before wait_mu_; nothing sleeps holding mu_.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/result.hpp"
#include "rsocket/datagram_protocol.hpp"
#include "rsocket/page_buffer.hpp"
#include "rsocket/socket.hpp"

namespace softhca::rsocket {

// A datagram rsocket's buffers are one slot of kDatagramSlotSize per queue
// entry (init_endpoint_locked fits the sizes to each other).
using DatagramConfig = QueueConfig;

class DatagramSocket final : public Socket {
 public:
  ~DatagramSocket() override;
  DatagramSocket(const DatagramSocket&) = delete;
  DatagramSocket& operator=(const DatagramSocket&) = delete;

  // `flags`: SOCK_NONBLOCK / SOCK_CLOEXEC.
  static Result<std::shared_ptr<DatagramSocket>> create(int domain, int flags);

  Kind kind() const override { return Kind::kDatagram; }
  int fd() const override { return udp_fd_; }

  Result<void> bind(const sockaddr* addr, socklen_t len) override;
  // Sets the default destination (rsend). As in rdma-core, only the UDP
  // socket is connected: datagrams from other peers still arrive over UD.
  Result<void> connect(const sockaddr* addr, socklen_t len) override;
  Result<void> shutdown(int how) override;
  void close() override;

  // One datagram to dest (the connected peer when dest is null).
  Result<size_t> send(const iovec* iov, int iovcnt, int flags, const sockaddr* dest, socklen_t dest_len);
  // One datagram; its excess beyond the buffers is discarded. Returns the
  // bytes copied, or with MSG_TRUNC the datagram's length, as UDP does.
  Result<size_t> recv(const iovec* iov, int iovcnt, int flags, sockaddr* from, socklen_t* fromlen, int* msg_flags);

  Result<void> local_address(sockaddr* addr, socklen_t* len) override;
  Result<void> peer_address(sockaddr* addr, socklen_t* len) override;
  Result<void> set_option(int level, int name, const void* value, socklen_t len) override;
  Result<void> get_option(int level, int name, void* value, socklen_t* len) override;
  int status_flags() override;
  Result<void> set_status_flags(int flags) override;
  int descriptor_flags() const override { return fd_flags_; }
  void set_descriptor_flags(int flags) override { fd_flags_ = flags; }

  short poll_events(short events) override;
  bool arm() override;
  int wait_fds(pollfd (&out)[2]) override;
  void consume_wakeups() override;

 private:
  // A UD QP for one local address (rdma-core's ds_qp).
  struct Qp {
    rdma_cm_id* id = nullptr;
    ibv_cq* cq = nullptr;
    ibv_mr* smr = nullptr;  // our send slots, registered on this QP's PD
    ibv_mr* rmr = nullptr;
    PageBuffer rbuf;        // rq_size slots, then the GRH area
    sockaddr_storage local{};  // IP of the QP, port of the UDP socket
    uint8_t header[kDsHeaderMaxLen];
    uint8_t header_len = 0;
    uint32_t ud_mtu = 0;  // the most one UD message carries: path MTU, at most a slot
    bool armed = false;
    unsigned unacked_events = 0;
  };
  // A peer address and how to reach it: through qp and ah once the peer's
  // QPN is known, through the UDP socket until then.
  struct Dest {
    sockaddr_storage addr{};
    Qp* qp = nullptr;
    ibv_ah* ah = nullptr;
    uint32_t qpn = 0;
  };
  // A received datagram: in a receive slot of qp, or (came by UDP) copied.
  struct Datagram {
    Qp* qp;
    uint32_t slot_offset;
    const uint8_t* payload;
    uint32_t length;
    sockaddr_storage src;
    std::vector<uint8_t> copy;
  };
  // A datagram arriving in fragments from one sender QP.
  struct Partial {
    uint16_t id;
    uint8_t next;
    uint8_t count;
    uint16_t total;
    sockaddr_storage src;
    std::vector<uint8_t> data;
  };
  using AddrKey = std::array<uint8_t, 20>;  // family, port, address

  explicit DatagramSocket(int domain);

  Result<void> init_endpoint_locked();
  Result<Dest*> get_dest_locked(const sockaddr_storage& addr);
  Result<sockaddr_storage> source_for_locked(const sockaddr_storage& dest);
  Result<Qp*> get_qp_locked(const sockaddr_storage& local);
  Result<Qp*> create_qp_locked(const sockaddr_storage& local);
  void destroy_qp(Qp& qp);
  void resolve_ah_locked(Dest& dest, uint32_t qpn);
  Result<void> post_recv_locked(Qp& qp, uint32_t offset);
  Result<size_t> send_udp_locked(const Dest& dest, MsgOp op, const iovec* iov, int iovcnt, int flags);
  void serve_udp_locked();
  void poll_cqs_locked();
  void take_fragment_locked(Qp& qp, uint32_t src_qp, const FragHeader& frag, const uint8_t* bytes, size_t len);
  void queue_copy_locked(const uint8_t* bytes, size_t len, const sockaddr_storage& src);
  Result<size_t> send_fragments_locked(std::unique_lock<std::mutex>& lock, Dest*& dest, const iovec* iov, int iovcnt,
                                       size_t len, int flags);
  void progress_locked();
  bool can_send_locked() const { return !free_slots_.empty(); }
  Result<void> wait_for(std::unique_lock<std::mutex>& lock, bool nonblocking, const std::function<bool()>& test,
                        int timeout_ms = -1);
  void arm_locked();
  void take_cq_events_locked();
  bool nonblocking(int flags) const { return nonblocking_ || (flags & MSG_DONTWAIT) != 0; }
  void release_resources();
  static AddrKey key_of(const sockaddr_storage& addr);

  const int domain_;
  std::mutex mu_;
  std::mutex wait_mu_;

  int udp_fd_ = -1;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_context* verbs_ = nullptr;  // of comp_channel_, shared by every QP
  std::atomic<bool> cq_armed_{false};  // every QP's CQ armed

  bool endpoint_ready_ = false;
  bool readable_ = true;
  bool writable_ = true;
  bool nonblocking_ = false;
  int fd_flags_ = 0;
  DatagramConfig config_;
  uint32_t sq_inline_ = 0;

  std::vector<std::unique_ptr<Qp>> qps_;
  std::map<AddrKey, std::unique_ptr<Dest>> dests_;
  Dest* conn_dest_ = nullptr;

  PageBuffer sbuf_;                  // sq_size slots
  std::vector<uint32_t> free_slots_;  // send slots not in flight
  std::deque<Datagram> received_;
  std::map<std::pair<Qp*, uint32_t>, Partial> partials_;  // by QP and sender QPN
  uint16_t next_frag_id_ = 0;
  uint32_t copied_queued_ = 0;       // received_ entries that came by UDP
};

}  // namespace softhca::rsocket
