// A stream rsocket's data path: the send ring and receive buffer, credits,
// completions, and the wait that sleeps on the completion channel.
//
// Flow control, as in rdma-core: the peer may write only into buffer
// space we granted (half of rbuf_ at a time, granted by RDMA WRITE of a
// RemoteSge into its target SGL) and may have at most rq_size data
// messages unconsumed (sseq_no_ against the credit limit sseq_comp_ that
// every kSgl message carries). Control messages use kCtrlSlots send queue
// entries of their own.
#include <endian.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "rsocket/stream_socket.hpp"

namespace softhca::rsocket {

namespace {

constexpr uint64_t kRecvWrId = uint64_t{1} << 63;  // rdma-core's RS_WR_ID_FLAG_RECV
constexpr unsigned kAckBatch = 64;

std::errc last_errc() { return static_cast<std::errc>(errno != 0 ? errno : EIO); }

// Walks an iovec array as one byte stream.
class IovCursor {
 public:
  IovCursor(const iovec* iov, int iovcnt) : iov_(iov), count_(iovcnt) { skip_empty(); }
  // Copies n bytes out of the iovecs into dst (send).
  void copy_out(uint8_t* dst, size_t n) {
    while (n != 0) {
      const size_t chunk = std::min(n, iov_[index_].iov_len - offset_);
      std::memcpy(dst, static_cast<const uint8_t*>(iov_[index_].iov_base) + offset_, chunk);
      dst += chunk;
      n -= chunk;
      advance(chunk);
    }
  }
  // Copies n bytes from src into the iovecs (receive).
  void copy_in(const uint8_t* src, size_t n) {
    while (n != 0) {
      const size_t chunk = std::min(n, iov_[index_].iov_len - offset_);
      std::memcpy(static_cast<uint8_t*>(iov_[index_].iov_base) + offset_, src, chunk);
      src += chunk;
      n -= chunk;
      advance(chunk);
    }
  }

 private:
  void advance(size_t n) {
    offset_ += n;
    if (offset_ == iov_[index_].iov_len) {
      ++index_;
      offset_ = 0;
      skip_empty();
    }
  }
  void skip_empty() {
    while (index_ < count_ && iov_[index_].iov_len == 0) ++index_;
  }
  const iovec* iov_;
  int count_;
  int index_ = 0;
  size_t offset_ = 0;
};

size_t iov_total(const iovec* iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

}  // namespace

Result<void> StreamSocket::init_buffers_locked() {
  const uint32_t half_rbuf = std::max<uint32_t>(config_.rbuf_size / 2, kSendLowWater);
  config_.rbuf_size = half_rbuf * 2;
  config_.sbuf_size = std::max<uint32_t>(config_.sbuf_size, 2 * kSendLowWater);
  rmsg_.assign(config_.rq_size + 1u, RecvMsg{MsgOp::kData, 0});

  if (!sbuf_.allocate(config_.sbuf_size + kCtrlSlots * sizeof(RemoteSge))) return fail(std::errc::not_enough_memory);
  smr_ = ibv_reg_mr(id_->pd, sbuf_.data(), sbuf_.size(), IBV_ACCESS_LOCAL_WRITE);
  if (smr_ == nullptr) return fail(last_errc());

  if (!target_buffer_.allocate(kTargetSglEntries * sizeof(RemoteSge) + config_.iomap_size * sizeof(IomapEntry)))
    return fail(std::errc::not_enough_memory);
  target_mr_ = ibv_reg_mr(id_->pd, target_buffer_.data(), target_buffer_.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (target_mr_ == nullptr) return fail(last_errc());

  if (!rbuf_.allocate(config_.rbuf_size)) return fail(std::errc::not_enough_memory);
  rmr_ = ibv_reg_mr(id_->pd, rbuf_.data(), rbuf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (rmr_ == nullptr) return fail(last_errc());

  sbuf_head_ = 0;
  sbuf_bytes_avail_ = config_.sbuf_size;
  // The first half goes to the peer in the private data; the second is
  // granted by the first credit update.
  rbuf_free_offset_ = half_rbuf;
  rbuf_bytes_avail_ = half_rbuf;
  sqe_avail_ = config_.sq_size - ctrl_max_seqno_;
  rseq_comp_ = config_.rq_size / 2;
  return {};
}

// Receives carry no buffer: every message is an RDMA WRITE WITH IMMEDIATE,
// whose data lands where the write says and whose immediate is the message.
Result<void> StreamSocket::post_recv_locked() {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = kRecvWrId;
  if (int err = ibv_post_recv(id_->qp, &wr, &bad); err != 0) return fail(static_cast<std::errc>(err));
  return {};
}

ConnData StreamSocket::conn_data_locked() const {
  ConnData data;
  data.flags = kConnFlagIomap;
  data.credits = config_.rq_size;
  data.target_iomap_size = static_cast<uint8_t>(value_to_scale(config_.iomap_size, 8));
  data.target_sgl = RemoteSge{reinterpret_cast<uintptr_t>(target_buffer_.data()), target_mr_->rkey, kTargetSglEntries};
  data.data_buf = RemoteSge{reinterpret_cast<uintptr_t>(rbuf_.data()), rmr_->rkey, config_.rbuf_size / 2};
  return data;
}

void StreamSocket::save_conn_data_locked(const ConnData& peer) {
  remote_sgl_ = peer.target_sgl;
  if (remote_sgl_.length == 0) remote_sgl_.length = kTargetSglEntries;
  remote_sge_ = 1;
  if ((peer.flags & kConnFlagIomap) != 0) {
    remote_iomap_.addr = remote_sgl_.addr + sizeof(RemoteSge) * remote_sgl_.length;
    remote_iomap_.length = scale_to_value(peer.target_iomap_size, 8);
    remote_iomap_.key = remote_sgl_.key;
  }
  targets_.clear();
  if (peer.data_buf.length != 0) targets_.push_back(peer.data_buf);
  next_grant_entry_ = 1 % kTargetSglEntries;
  sseq_comp_ = peer.credits;
}

Result<void> StreamSocket::post_write_msg_locked(ibv_sge* sgl, int nsge, uint32_t msg, unsigned send_flags,
                                                 uint64_t addr, uint32_t rkey) {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = msg;  // the completion says what it frees
  wr.sg_list = sgl;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = send_flags;
  wr.imm_data = htobe32(msg);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (int err = ibv_post_send(id_->qp, &wr, &bad); err != 0) return fail(static_cast<std::errc>(err));
  return {};
}

Result<void> StreamSocket::post_msg_locked(uint32_t msg) { return post_write_msg_locked(nullptr, 0, msg, 0, 0, 0); }

bool StreamSocket::can_send_locked() const {
  return sqe_avail_ != 0 && sbuf_bytes_avail_ >= kSendLowWater && sseq_no_ != sseq_comp_ && !targets_.empty();
}

bool StreamSocket::all_sends_done_locked() const {
  return (ctrl_max_seqno_ - ctrl_seqno_) + sqe_avail_ == config_.sq_size || state_ != State::kConnected;
}

void StreamSocket::update_credits_locked() {
  const uint32_t half = config_.rbuf_size / 2;
  const bool buffer_to_grant = rbuf_bytes_avail_ >= half;
  const bool credits_due = static_cast<int16_t>(static_cast<uint16_t>(rseq_no_ - rseq_comp_)) >= 0;
  if ((buffer_to_grant || credits_due) && ctrl_available_locked() && state_ == State::kConnected) send_credits_locked();
}

void StreamSocket::send_credits_locked() {
  const uint32_t half = config_.rbuf_size / 2;
  ++ctrl_seqno_;
  rseq_comp_ = static_cast<uint16_t>(rseq_no_ + config_.rq_size / 2);
  const uint32_t msg = msg_encode(MsgOp::kSgl, static_cast<uint16_t>(rseq_no_ + config_.rq_size));
  Result<void> posted;
  if (rbuf_bytes_avail_ >= half) {
    RemoteSge grant{reinterpret_cast<uintptr_t>(&rbuf_[rbuf_free_offset_]), rmr_->rkey, half};
    ibv_sge sge{};
    sge.length = sizeof grant;
    unsigned flags = 0;
    if (sq_inline_ >= sizeof grant) {
      sge.addr = reinterpret_cast<uintptr_t>(&grant);
      flags = IBV_SEND_INLINE;
    } else {
      // One slot per control message in flight, after the send ring.
      uint8_t* slot = &sbuf_[config_.sbuf_size + sizeof(RemoteSge) * (ctrl_seqno_ % kCtrlSlots)];
      std::memcpy(slot, &grant, sizeof grant);
      sge.addr = reinterpret_cast<uintptr_t>(slot);
      sge.lkey = smr_->lkey;
    }
    posted = post_write_msg_locked(&sge, 1, msg, flags, remote_sgl_.addr + remote_sge_ * sizeof(RemoteSge),
                                   remote_sgl_.key);
    rbuf_bytes_avail_ -= half;
    rbuf_free_offset_ = (rbuf_free_offset_ + half) % config_.rbuf_size;
    remote_sge_ = (remote_sge_ + 1) % remote_sgl_.length;
  } else {
    posted = post_msg_locked(msg);
  }
  if (!posted) {
    state_ = State::kError;
    error_ = ECONNRESET;
  }
}

// A kSgl message has arrived; if it came with a grant, the grant was
// written into our target SGL before the message (RC ordering). Taking it
// here, rather than reading the entry whenever, never sees half a write.
void StreamSocket::take_sgl_update_locked() {
  auto* entry = reinterpret_cast<RemoteSge*>(target_buffer_.data()) + next_grant_entry_;
  // No fence of our own: ibv_poll_cq handed us the completion with acquire
  // ordering, and the peer's bytes were placed before it.
  RemoteSge grant;
  std::memcpy(&grant, entry, sizeof grant);
  if (grant.length == 0) return;
  targets_.push_back(grant);
  entry->length = 0;
  next_grant_entry_ = (next_grant_entry_ + 1) % kTargetSglEntries;
}

void StreamSocket::poll_cq_locked() {
  if (cq_ == nullptr) return;
  ibv_wc wcs[32];
  uint32_t received = 0;
  int n;
  while ((n = ibv_poll_cq(cq_, 32, wcs)) > 0) {
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if ((wc.wr_id & kRecvWrId) != 0) {
        if (wc.status != IBV_WC_SUCCESS) continue;  // flushed at teardown
        ++received;
        if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) continue;
        const uint32_t msg = be32toh(wc.imm_data);
        switch (msg_op(msg)) {
          case MsgOp::kSgl:
            sseq_comp_ = static_cast<uint16_t>(msg_data(msg));
            take_sgl_update_locked();
            break;
          case MsgOp::kIomapSgl:
            take_iomap_update_locked(msg_data(msg));
            break;
          case MsgOp::kWrite:
            break;
          case MsgOp::kCtrl:
            if (msg_data(msg) == static_cast<uint32_t>(CtrlCode::kDisconnect)) {
              set_disconnected_locked();
            } else if (msg_data(msg) == static_cast<uint32_t>(CtrlCode::kShutdown)) {
              if (writable_)
                readable_ = false;
              else
                set_disconnected_locked();
            }
            break;
          default:
            rmsg_[rmsg_tail_] = RecvMsg{msg_op(msg), msg_data(msg)};
            rmsg_tail_ = (rmsg_tail_ + 1) % rmsg_.size();
            break;
        }
        continue;
      }
      const uint32_t msg = static_cast<uint32_t>(wc.wr_id);
      switch (msg_op(msg)) {
        case MsgOp::kSgl:
          ++ctrl_max_seqno_;
          break;
        case MsgOp::kCtrl:
          ++ctrl_max_seqno_;
          if (msg_data(msg) == static_cast<uint32_t>(CtrlCode::kDisconnect) && state_ == State::kConnected)
            set_disconnected_locked();
          break;
        case MsgOp::kIomapSgl:
          ++sqe_avail_;
          sbuf_bytes_avail_ += sizeof(IomapEntry);
          break;
        default:
          ++sqe_avail_;
          sbuf_bytes_avail_ += msg_data(msg);
          break;
      }
      if (wc.status != IBV_WC_SUCCESS && (state_ == State::kConnected || state_ == State::kDisconnected)) {
        // The peer no longer answers (retries exhausted) or our QP broke.
        state_ = State::kError;
        error_ = ECONNRESET;
        readable_ = writable_ = false;
      }
    }
  }
  if (state_ == State::kConnected) {
    for (; received != 0; --received) {
      if (!post_recv_locked()) {
        state_ = State::kError;
        error_ = ECONNRESET;
        break;
      }
    }
  }
}

void StreamSocket::progress_locked() {
  handle_cm_events_locked();
  if (cq_ == nullptr) return;
  update_credits_locked();
  poll_cq_locked();
  update_credits_locked();
}

void StreamSocket::take_cq_event_locked() {
  if (comp_channel_ == nullptr) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(comp_channel_, &cq, &context) == 0) {
    cq_armed_ = false;
    if (++unacked_cq_events_ >= kAckBatch) {
      ibv_ack_cq_events(cq_, unacked_cq_events_);
      unacked_cq_events_ = 0;
    }
  }
}

void StreamSocket::sleep_on_channels(std::unique_lock<std::mutex>& lock) {
  {
    std::unique_lock wait(wait_mu_);
    lock.unlock();
    // Another thread took the CQ event meanwhile: what it processed may be
    // what we wait for, so look again instead of sleeping.
    if (cq_ == nullptr || cq_armed_) {
      pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {cq_ != nullptr ? comp_channel_->fd : -1, POLLIN, 0}};
      ::poll(fds, 2, -1);
    }
  }
  lock.lock();
  take_cq_event_locked();
}

Result<void> StreamSocket::wait_for(std::unique_lock<std::mutex>& lock, bool nonblocking,
                                    const std::function<bool()>& test) {
  for (;;) {
    progress_locked();
    if (test()) return {};
    if (state_ == State::kError) return fail(static_cast<std::errc>(error_));
    if (nonblocking) return fail(std::errc::resource_unavailable_try_again);
    if (cq_ != nullptr && !cq_armed_) {
      // Arm, then look once more: a completion that came before the arm
      // would not wake us.
      ibv_req_notify_cq(cq_, 0);
      cq_armed_ = true;
      continue;
    }
    sleep_on_channels(lock);
  }
}

Result<void> StreamSocket::send_ctrl_locked(std::unique_lock<std::mutex>& lock, CtrlCode code) {
  auto waited = wait_for(lock, false, [&] { return ctrl_available_locked() || state_ != State::kConnected; });
  if (!waited) return waited;
  if (state_ != State::kConnected) return {};
  ++ctrl_seqno_;
  return post_msg_locked(msg_encode(MsgOp::kCtrl, static_cast<uint32_t>(code)));
}

// A nonblocking connect still under way: finish it first, or say EAGAIN
// (as rdma-core's rsend and rrecv do).
Result<void> StreamSocket::finish_connecting_locked(std::unique_lock<std::mutex>& lock, int flags) {
  auto connecting = [&] {
    return state_ == State::kResolvingAddr || state_ == State::kResolvingRoute || state_ == State::kConnecting;
  };
  if (!connecting()) return {};
  return wait_for(lock, nonblocking(flags), [&] { return !connecting(); });
}

Result<size_t> StreamSocket::send(const iovec* iov, int iovcnt, int flags) {
  std::unique_lock lock(mu_);
  if (auto r = finish_connecting_locked(lock, flags); !r) return fail(r.error());
  if (auto r = send_iomaps_locked(lock, flags); !r) return fail(r.error());
  return send_locked(lock, iov, iovcnt, flags);
}

// Small transfers go inline (copied at post time, from inline_buf); larger
// ones are copied to the send ring, in two pieces when they wrap.
int StreamSocket::stage_send_locked(const std::function<void(uint8_t*, size_t)>& copy, uint32_t len,
                                    ibv_sge (&sges)[2], uint8_t* inline_buf, size_t inline_cap,
                                    unsigned& send_flags) {
  if (len <= sq_inline_ && len <= inline_cap) {
    copy(inline_buf, len);
    sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(inline_buf), len, 0};
    send_flags = IBV_SEND_INLINE;
    return 1;
  }
  send_flags = 0;
  const uint32_t first = std::min(len, config_.sbuf_size - sbuf_head_);
  copy(&sbuf_[sbuf_head_], first);
  sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(&sbuf_[sbuf_head_]), first, smr_->lkey};
  int nsge = 1;
  if (first < len) {
    copy(sbuf_.data(), len - first);
    sges[1] = ibv_sge{reinterpret_cast<uintptr_t>(sbuf_.data()), len - first, smr_->lkey};
    nsge = 2;
  }
  sbuf_head_ = (sbuf_head_ + len) % config_.sbuf_size;
  return nsge;
}

Result<size_t> StreamSocket::send_locked(std::unique_lock<std::mutex>& lock, const iovec* iov, int iovcnt,
                                         int flags) {
  auto broken = [&]() -> std::errc {
    if (state_ == State::kError) return static_cast<std::errc>(error_);
    if (state_ == State::kConnected || state_ == State::kDisconnected) return std::errc::broken_pipe;
    return std::errc::not_connected;
  };
  if (state_ != State::kConnected || !writable_) return fail(broken());
  const size_t total = iov_total(iov, iovcnt);
  IovCursor source(iov, iovcnt);
  size_t left = total;
  uint32_t olen = kFirstTransfer;
  while (left != 0) {
    if (!can_send_locked()) {
      auto waited = wait_for(lock, nonblocking(flags),
                             [&] { return can_send_locked() || !writable_ || state_ != State::kConnected; });
      if (waited && (!writable_ || state_ != State::kConnected)) waited = fail(broken());
      if (!waited) {
        if (left != total) break;
        return fail(waited.error());
      }
    }
    // Transfers grow from 2 KiB to 64 KiB so that a large send starts
    // arriving early (rdma-core's overlap).
    uint32_t xfer = static_cast<uint32_t>(std::min<size_t>(left, olen));
    if (olen < left && olen < kMaxTransfer) olen <<= 1;
    xfer = std::min({xfer, sbuf_bytes_avail_, targets_.front().length});

    RemoteSge& target = targets_.front();
    const uint64_t addr = target.addr;
    const uint32_t rkey = target.key;
    target.addr += xfer;
    target.length -= xfer;
    if (target.length == 0) targets_.pop_front();
    ++sseq_no_;
    --sqe_avail_;
    sbuf_bytes_avail_ -= xfer;

    ibv_sge sges[2]{};
    unsigned send_flags = 0;
    uint8_t inline_copy[256];
    const int nsge = stage_send_locked([&](uint8_t* dst, size_t n) { source.copy_out(dst, n); }, xfer, sges,
                                       inline_copy, sizeof inline_copy, send_flags);
    if (auto r = post_write_msg_locked(sges, nsge, msg_encode(MsgOp::kData, xfer), send_flags, addr, rkey); !r) {
      state_ = State::kError;
      error_ = ECONNRESET;
      if (left != total) break;
      return fail(std::errc::connection_reset);
    }
    left -= xfer;
  }
  return total - left;
}

Result<size_t> StreamSocket::recv(const iovec* iov, int iovcnt, int flags) {
  std::unique_lock lock(mu_);
  if (auto r = finish_connecting_locked(lock, flags); !r) return fail(r.error());
  if (state_ != State::kConnected && state_ != State::kDisconnected && state_ != State::kError)
    return fail(std::errc::not_connected);
  const size_t total = iov_total(iov, iovcnt);
  if (total == 0) return size_t{0};
  IovCursor dest(iov, iovcnt);
  size_t left = total;
  do {
    if (!have_rdata_locked()) {
      auto waited = wait_for(lock, nonblocking(flags),
                             [&] { return have_rdata_locked() || !readable_ || state_ != State::kConnected; });
      if (!waited) {
        if (left != total) break;
        return fail(waited.error());
      }
      if (!have_rdata_locked()) break;  // end of stream
    }
    if ((flags & MSG_PEEK) != 0) {
      uint32_t head = rmsg_head_;
      uint32_t offset = rbuf_offset_;
      while (left != 0 && head != rmsg_tail_) {
        const uint32_t take = static_cast<uint32_t>(std::min<size_t>(left, rmsg_[head].bytes));
        for (uint32_t done = 0; done < take;) {
          const uint32_t chunk = std::min(take - done, config_.rbuf_size - offset);
          dest.copy_in(&rbuf_[offset], chunk);
          offset = (offset + chunk) % config_.rbuf_size;
          done += chunk;
        }
        left -= take;
        head = (head + 1) % rmsg_.size();
      }
      break;
    }
    while (left != 0 && have_rdata_locked()) {
      RecvMsg& msg = rmsg_[rmsg_head_];
      const uint32_t take = static_cast<uint32_t>(std::min<size_t>(left, msg.bytes));
      for (uint32_t done = 0; done < take;) {
        const uint32_t chunk = std::min(take - done, config_.rbuf_size - rbuf_offset_);
        dest.copy_in(&rbuf_[rbuf_offset_], chunk);
        rbuf_offset_ = (rbuf_offset_ + chunk) % config_.rbuf_size;
        done += chunk;
      }
      msg.bytes -= take;
      if (msg.bytes == 0) {
        ++rseq_no_;
        rmsg_head_ = (rmsg_head_ + 1) % rmsg_.size();
      }
      rbuf_bytes_avail_ += take;
      left -= take;
    }
  } while (left != 0 && (flags & MSG_WAITALL) != 0 && readable_);
  if (cq_ != nullptr) update_credits_locked();
  return total - left;
}

}  // namespace softhca::rsocket
