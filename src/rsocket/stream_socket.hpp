// A stream rsocket (SOCK_STREAM): one RC QP made with the public rdma_cm and
// verbs API, carrying rdma-core's rsocket protocol (rsocket/protocol.hpp).
//
// Files: stream_socket.cpp holds the connection's life (create, bind,
// listen, accept, connect, the CM events, shutdown, close), stream_data.cpp
// the data path (send and receive buffers, credits, completions), and
// stream_options.cpp the socket options and file status flags.
//
// Locking: mu_ guards all state, the CQ and the QP. A thread that must
// sleep takes wait_mu_ before it lets go of mu_ and sleeps in poll(2) on
// the completion channel and the CM event channel; the CQ is armed (under
// mu_) before the last check, so no completion is missed. Whoever takes a
// CQ event clears cq_armed_, and a waiter that finds it clear after taking
// wait_mu_ does not sleep (rdma-core's cq_lock / cq_wait_lock pair).
// Order: mu_ before wait_mu_; nothing sleeps holding mu_.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/result.hpp"
#include "rsocket/page_buffer.hpp"
#include "rsocket/protocol.hpp"
#include "rsocket/socket.hpp"

namespace softhca::rsocket {

// A stream rsocket's sizes also say how many riomap entries it offers.
struct StreamConfig : QueueConfig {
  uint32_t iomap_size = 0;  // 0: riomap unused
};

class StreamSocket final : public Socket {
 public:
  enum class State {
    kInit,
    kBound,
    kListening,
    kResolvingAddr,
    kResolvingRoute,
    kConnecting,
    kConnected,
    kConnectError,
    kDisconnected,
    kError,
  };

  ~StreamSocket() override;
  StreamSocket(const StreamSocket&) = delete;
  StreamSocket& operator=(const StreamSocket&) = delete;

  // A new unconnected socket; its descriptor is its own rdma_cm event
  // channel's. `flags`: SOCK_NONBLOCK / SOCK_CLOEXEC.
  static Result<std::shared_ptr<StreamSocket>> create(int domain, int flags);

  Kind kind() const override { return Kind::kStream; }
  int fd() const override { return channel_->fd; }

  Result<void> bind(const sockaddr* addr, socklen_t len) override;
  Result<void> listen(int backlog);
  Result<std::shared_ptr<StreamSocket>> accept(int flags);
  // EINPROGRESS when nonblocking and not finished; a second call continues.
  Result<void> connect(const sockaddr* addr, socklen_t len) override;
  Result<size_t> send(const iovec* iov, int iovcnt, int flags);
  Result<size_t> recv(const iovec* iov, int iovcnt, int flags);
  Result<void> shutdown(int how) override;
  // Orderly shutdown if connected, then every resource goes.
  void close() override;

  // riomap / riounmap / riowrite (stream_iomap.cpp).
  Result<off_t> iomap(void* buf, size_t len, int prot, off_t offset);
  Result<void> iounmap(void* buf, size_t len);
  Result<size_t> iowrite(const void* buf, size_t count, off_t offset, int flags);

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
  explicit StreamSocket(int domain);

  // Connection (stream_socket.cpp).
  Result<void> open_channel(int flags);
  Result<void> create_endpoint_locked();
  void handle_cm_events_locked();
  void handle_cm_event_locked(rdma_cm_event& ev);
  Result<void> advance_connect_locked();
  Result<void> finish_connect_locked(const rdma_cm_event& ev);
  void fail_connect_locked(int err);
  void set_disconnected_locked();
  Result<rdma_cm_event*> next_connect_request_locked();
  Result<std::shared_ptr<StreamSocket>> accept_request(rdma_cm_event* ev, const StreamConfig& config, int flags);
  void release_resources();

  // Data path (stream_data.cpp).
  Result<void> init_buffers_locked();
  Result<void> post_recv_locked();
  void save_conn_data_locked(const ConnData& peer);
  ConnData conn_data_locked() const;
  Result<void> post_write_msg_locked(ibv_sge* sgl, int nsge, uint32_t msg, unsigned send_flags, uint64_t addr,
                                     uint32_t rkey);
  Result<void> post_msg_locked(uint32_t msg);
  bool can_send_locked() const;
  bool have_rdata_locked() const { return rmsg_head_ != rmsg_tail_; }
  bool connected_locked() const { return state_ == State::kConnected; }
  bool ctrl_available_locked() const { return ctrl_seqno_ != ctrl_max_seqno_; }
  bool all_sends_done_locked() const;
  void update_credits_locked();
  void send_credits_locked();
  void poll_cq_locked();
  void take_sgl_update_locked();
  void progress_locked();
  // Progress until test() holds; sleeps unless nonblocking. EAGAIN when it
  // would sleep in nonblocking mode; the socket error when it broke.
  Result<void> wait_for(std::unique_lock<std::mutex>& lock, bool nonblocking, const std::function<bool()>& test);
  void sleep_on_channels(std::unique_lock<std::mutex>& lock);
  void take_cq_event_locked();
  Result<size_t> send_locked(std::unique_lock<std::mutex>& lock, const iovec* iov, int iovcnt, int flags);
  Result<void> finish_connecting_locked(std::unique_lock<std::mutex>& lock, int flags);
  Result<void> send_ctrl_locked(std::unique_lock<std::mutex>& lock, CtrlCode code);
  bool nonblocking(int flags) const { return nonblocking_ || (flags & MSG_DONTWAIT) != 0; }
  // Stages len bytes of source for a send at the send ring's head (or
  // inline); returns the SGEs in sges and their count.
  int stage_send_locked(const std::function<void(uint8_t*, size_t)>& copy, uint32_t len, ibv_sge (&sges)[2],
                        uint8_t* inline_buf, size_t inline_cap, unsigned& send_flags);
  Result<void> send_iomaps_locked(std::unique_lock<std::mutex>& lock, int flags);
  void take_iomap_update_locked(uint32_t index);
  const IomapEntry* find_peer_iomap_locked(uint64_t offset) const;

  const int domain_;
  std::mutex mu_;
  std::mutex wait_mu_;

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::atomic<bool> cq_armed_{false};
  unsigned unacked_cq_events_ = 0;

  State state_ = State::kInit;
  bool readable_ = false;  // shutdown halves of a connected socket
  bool writable_ = false;
  int error_ = 0;          // SO_ERROR, and why kError / kConnectError
  bool nonblocking_ = false;
  int fd_flags_ = 0;
  bool reuse_addr_ = false;
  bool keepalive_ = false;
  bool nodelay_ = false;
  int keepidle_ = 7200;
  linger linger_{};
  StreamConfig config_;
  sockaddr_storage connect_dst_{};

  // A listener's connect requests not yet accepted (events unacknowledged).
  std::deque<rdma_cm_event*> requests_;

  // Receive side: the peer writes into rbuf_, two halves granted in turn.
  PageBuffer rbuf_;
  ibv_mr* rmr_ = nullptr;
  struct RecvMsg {
    MsgOp op;
    uint32_t bytes;
  };
  std::vector<RecvMsg> rmsg_;  // rq_size + 1 slots
  uint32_t rmsg_head_ = 0;
  uint32_t rmsg_tail_ = 0;
  uint32_t rbuf_offset_ = 0;      // next byte to read
  uint32_t rbuf_bytes_avail_ = 0;  // consumed bytes not yet granted back
  uint32_t rbuf_free_offset_ = 0;  // start of the next half to grant
  uint16_t rseq_no_ = 0;           // data messages consumed
  uint16_t rseq_comp_ = 0;         // when to grant credits again

  // Target SGL: the array the peer writes its buffer grants into.
  PageBuffer target_buffer_;  // kTargetSglEntries RemoteSge, then iomap entries
  ibv_mr* target_mr_ = nullptr;
  uint32_t next_grant_entry_ = 1;  // entry 0 came in the private data
  std::deque<RemoteSge> targets_;  // granted peer buffer space, in order

  // riomap: our mappings (index >= 0: announced to the peer, who may
  // riowrite into them; -1: local only), and the peer's, by index.
  struct IomapMapping {
    uint64_t offset;
    ibv_mr* mr;
    int index;
    bool announced;
  };
  std::vector<IomapMapping> iomaps_;
  std::vector<IomapEntry> peer_iomaps_;

  // The peer's target SGL, where we write our grants.
  RemoteSge remote_sgl_{};
  uint32_t remote_sge_ = 1;
  RemoteSge remote_iomap_{};

  // Send side.
  PageBuffer sbuf_;  // sbuf_size + a control area
  ibv_mr* smr_ = nullptr;
  uint32_t sbuf_head_ = 0;          // where the next send copies to
  uint32_t sbuf_bytes_avail_ = 0;
  uint32_t sqe_avail_ = 0;
  uint16_t sseq_no_ = 0;            // data messages sent
  uint16_t sseq_comp_ = 0;          // the peer's credit limit
  uint32_t ctrl_seqno_ = 0;
  uint32_t ctrl_max_seqno_ = kCtrlSlots;
  uint32_t sq_inline_ = 0;
};

}  // namespace softhca::rsocket
