// riomap / riounmap / riowrite: writes straight into memory the peer has
// mapped, as rdma-core does them. A riomap with PROT_WRITE registers the
// buffer for remote writes and announces it: before our next send, an
// RDMA WRITE WITH IMMEDIATE (RS_OP_IOMAP_SGL, the entry's index) puts
// {offset, addr, rkey, length} into the peer's iomap array, which follows
// its target SGL (sized by the peer's RDMA_IOMAPSIZE, in its connect data).
// riowrite then RDMA WRITEs (no immediate: the peer learns nothing) into
// the peer's entry that covers the offset.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rsocket/stream_socket.hpp"

namespace softhca::rsocket {

Result<off_t> StreamSocket::iomap(void* buf, size_t len, int prot, off_t offset) {
  std::lock_guard lock(mu_);
  if (buf == nullptr || len == 0 || (prot & ~(PROT_WRITE | PROT_NONE)) != 0 || id_ == nullptr || id_->pd == nullptr)
    return fail(std::errc::invalid_argument);
  int index = -1;
  int access = IBV_ACCESS_LOCAL_WRITE;
  if ((prot & PROT_WRITE) != 0) {
    // A free slot of the peer's iomap array.
    for (uint32_t i = 0; i < remote_iomap_.length && index < 0; ++i) {
      const bool used = std::any_of(iomaps_.begin(), iomaps_.end(), [&](const IomapMapping& m) {
        return m.index == static_cast<int>(i);
      });
      if (!used) index = static_cast<int>(i);
    }
    if (index < 0) return fail(std::errc::not_enough_memory);
    access |= IBV_ACCESS_REMOTE_WRITE;
  }
  ibv_mr* mr = ibv_reg_mr(id_->pd, buf, len, access);
  if (mr == nullptr) return fail(static_cast<std::errc>(errno != 0 ? errno : ENOMEM));
  if (offset == -1) offset = static_cast<off_t>(reinterpret_cast<uintptr_t>(buf));
  iomaps_.push_back(IomapMapping{static_cast<uint64_t>(offset), mr, index, index < 0});
  return offset;
}

Result<void> StreamSocket::iounmap(void* buf, size_t len) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(iomaps_.begin(), iomaps_.end(),
                         [&](const IomapMapping& m) { return m.mr->addr == buf && m.mr->length == len; });
  if (it == iomaps_.end()) return fail(std::errc::invalid_argument);
  ibv_dereg_mr(it->mr);
  iomaps_.erase(it);
  return {};
}

// Announces the mappings the peer has not heard of yet, in order.
Result<void> StreamSocket::send_iomaps_locked(std::unique_lock<std::mutex>& lock, int flags) {
  for (size_t i = 0; i < iomaps_.size(); ++i) {
    if (iomaps_[i].announced) continue;
    if (!can_send_locked()) {
      auto waited = wait_for(lock, nonblocking(flags),
                             [&] { return can_send_locked() || !writable_ || state_ != State::kConnected; });
      if (!waited) return waited;
      if (!writable_ || state_ != State::kConnected) return fail(std::errc::connection_reset);
      if (i >= iomaps_.size() || iomaps_[i].announced) continue;  // changed while we waited
    }
    IomapMapping& m = iomaps_[i];
    const IomapEntry entry{m.offset, RemoteSge{reinterpret_cast<uintptr_t>(m.mr->addr), m.mr->rkey,
                                               static_cast<uint32_t>(m.mr->length)}};
    ibv_sge sges[2]{};
    unsigned send_flags = 0;
    uint8_t inline_copy[sizeof(IomapEntry)];
    const auto* bytes = reinterpret_cast<const uint8_t*>(&entry);
    size_t copied = 0;
    const int nsge = stage_send_locked(
        [&](uint8_t* dst, size_t n) {
          std::memcpy(dst, bytes + copied, n);
          copied += n;
        },
        sizeof entry, sges, inline_copy, sizeof inline_copy, send_flags);
    ++sseq_no_;
    --sqe_avail_;
    sbuf_bytes_avail_ -= sizeof(IomapEntry);
    m.announced = true;
    if (auto r = post_write_msg_locked(sges, nsge, msg_encode(MsgOp::kIomapSgl, static_cast<uint32_t>(m.index)),
                                       send_flags, remote_iomap_.addr + m.index * sizeof(IomapEntry),
                                       remote_iomap_.key);
        !r) {
      state_ = State::kError;
      error_ = ECONNRESET;
      return fail(std::errc::connection_reset);
    }
  }
  return {};
}

// The peer wrote entry `index` of our iomap array before this message.
void StreamSocket::take_iomap_update_locked(uint32_t index) {
  if (index >= config_.iomap_size) return;
  if (peer_iomaps_.size() < config_.iomap_size) peer_iomaps_.resize(config_.iomap_size, IomapEntry{});
  // Placed before the completion ibv_poll_cq gave us (acquire), as grants are.
  const uint8_t* array = target_buffer_.data() + kTargetSglEntries * sizeof(RemoteSge);
  std::memcpy(&peer_iomaps_[index], array + index * sizeof(IomapEntry), sizeof(IomapEntry));
}

const IomapEntry* StreamSocket::find_peer_iomap_locked(uint64_t offset) const {
  for (const IomapEntry& e : peer_iomaps_)
    if (e.sge.length != 0 && offset >= e.offset && offset < e.offset + e.sge.length) return &e;
  return nullptr;
}

Result<size_t> StreamSocket::iowrite(const void* buf, size_t count, off_t offset, int flags) {
  std::unique_lock lock(mu_);
  if (state_ != State::kConnected || !writable_) {
    if (state_ == State::kError) return fail(static_cast<std::errc>(error_));
    return fail(state_ == State::kDisconnected ? std::errc::broken_pipe : std::errc::not_connected);
  }
  if (auto r = send_iomaps_locked(lock, flags); !r) return fail(r.error());
  const auto* source = static_cast<const uint8_t*>(buf);
  size_t left = count;
  uint64_t at = static_cast<uint64_t>(offset);
  uint32_t olen = kFirstTransfer;
  while (left != 0) {
    if (!can_send_locked()) {
      auto waited = wait_for(lock, nonblocking(flags),
                             [&] { return can_send_locked() || !writable_ || state_ != State::kConnected; });
      if (waited && (!writable_ || state_ != State::kConnected)) waited = fail(std::errc::connection_reset);
      if (!waited) {
        if (left != count) break;
        return fail(waited.error());
      }
    }
    // Looked up after any wait: an announcement may have just arrived.
    const IomapEntry* target = find_peer_iomap_locked(at);
    if (target == nullptr) break;  // nothing mapped there: a short write, as rdma-core's
    uint32_t xfer = static_cast<uint32_t>(std::min<size_t>(left, olen));
    if (olen < left && olen < kMaxTransfer) olen <<= 1;
    xfer = static_cast<uint32_t>(std::min<uint64_t>({xfer, sbuf_bytes_avail_, target->offset + target->sge.length - at}));
    const uint64_t remote_addr = target->sge.addr + (at - target->offset);
    const uint32_t rkey = target->sge.key;

    ibv_sge sges[2]{};
    unsigned send_flags = 0;
    uint8_t inline_copy[256];
    const int nsge = stage_send_locked(
        [&](uint8_t* dst, size_t n) {
          std::memcpy(dst, source, n);
          source += n;
        },
        xfer, sges, inline_copy, sizeof inline_copy, send_flags);
    --sqe_avail_;
    sbuf_bytes_avail_ -= xfer;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = msg_encode(MsgOp::kWrite, xfer);
    wr.sg_list = sges;
    wr.num_sge = nsge;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = send_flags;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(id_->qp, &wr, &bad) != 0) {
      state_ = State::kError;
      error_ = ECONNRESET;
      if (left != count) break;
      return fail(std::errc::connection_reset);
    }
    left -= xfer;
    at += xfer;
  }
  return count - left;
}

}  // namespace softhca::rsocket
