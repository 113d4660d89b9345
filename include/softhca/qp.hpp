// softhca C++ API: queue pair, its state transitions and posting work.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "ah.hpp"
#include "cq.hpp"
#include "error.hpp"
#include "flags.hpp"
#include "handle.hpp"
#include "mr.hpp"
#include "pd.hpp"
#include "srq.hpp"

namespace softhca {

enum class QpType { RC = IBV_QPT_RC, UC = IBV_QPT_UC, UD = IBV_QPT_UD };

enum class SendFlags : unsigned {
  None = 0,
  Signaled = IBV_SEND_SIGNALED,
  Solicited = IBV_SEND_SOLICITED,
  Inline = IBV_SEND_INLINE,
  Fence = IBV_SEND_FENCE,
};
template <>
struct EnableBitmask<SendFlags> : std::true_type {};

struct QpConfig {
  QpType type = QpType::RC;
  ibv_qp_cap cap{.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  // Every send completes on the CQ, not only those posted with Signaled.
  bool sq_sig_all = false;
  // Receives come from this shared receive queue instead of the QP's own
  // (cap.max_recv_wr and max_recv_sge are then ignored).
  const SharedReceiveQueue* srq = nullptr;
};

// What the remote side tells us out of band (a socket, rdma_cm private data)
// before we can move to RTR.
struct RemoteQp {
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  ibv_gid gid{};
  std::uint16_t lid = 0;  // InfiniBand only; 0 on RoCE
};

// The local side's path and reliability knobs; the defaults suit RoCE with
// GID index 0 on port 1.
struct PathParams {
  std::uint8_t port = 1;
  std::uint8_t sgid_index = 0;
  std::uint8_t hop_limit = 64;
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint8_t max_rd_atomic = 1;       // RDMA READ/atomics we may have outstanding
  std::uint8_t max_dest_rd_atomic = 1;  // ... and the remote may have outstanding at us
  std::uint8_t min_rnr_timer = 12;      // 0.64 ms
  std::uint8_t timeout = 14;            // 4.096 us * 2^14 = 67 ms
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;  // 7 = retry forever
};

namespace detail {
struct QpTraits {
  static constexpr const char* verb = "ibv_destroy_qp";
  static int destroy(ibv_qp* q) noexcept { return ibv_destroy_qp(q); }
};
}  // namespace detail

class QueuePair : public detail::Handle<ibv_qp, detail::QpTraits> {
 public:
  using Handle::Handle;

  static Expected<QueuePair> create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                    const CompletionQueue& recv_cq, const QpConfig& cfg = {}) noexcept {
    ibv_qp_init_attr a{};
    a.send_cq = send_cq.get();
    a.recv_cq = recv_cq.get();
    a.cap = cfg.cap;
    a.qp_type = static_cast<ibv_qp_type>(cfg.type);
    a.sq_sig_all = cfg.sq_sig_all ? 1 : 0;
    if (cfg.srq != nullptr) {
      a.srq = cfg.srq->get();
      a.cap.max_recv_wr = a.cap.max_recv_sge = 0;
    }
    errno = 0;
    auto q = detail::check_ptr(ibv_create_qp(pd.get(), &a), "ibv_create_qp");
    if (!q) return std::unexpected(q.error());
    return QueuePair(*q);
  }
  static QueuePair make(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                        const CompletionQueue& recv_cq, const QpConfig& cfg = {}) {
    return value_or_throw(create(pd, send_cq, recv_cq, cfg));
  }

  std::uint32_t qpn() const noexcept { return get()->qp_num; }
  QpType type() const noexcept { return static_cast<QpType>(get()->qp_type); }

  Expected<void> modify(ibv_qp_attr& attr, int mask) const noexcept {
    errno = 0;
    return detail::check_rc(ibv_modify_qp(get(), &attr, mask), "ibv_modify_qp");
  }
  Expected<ibv_qp_state> state() const noexcept {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    errno = 0;
    if (auto r = detail::check_rc(ibv_query_qp(get(), &a, IBV_QP_STATE, &init), "ibv_query_qp"); !r)
      return std::unexpected(r.error());
    return a.qp_state;
  }

  // RESET -> INIT for RC/UC: which remote operations the peer may do on us.
  Expected<void> to_init(Access remote_access, std::uint8_t port = 1, std::uint16_t pkey_index = 0) const noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port;
    a.pkey_index = pkey_index;
    a.qp_access_flags = static_cast<unsigned>(to_ibv(remote_access));
    return modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  // RESET -> INIT for UD: the Q_Key that incoming datagrams must carry.
  Expected<void> to_init_ud(std::uint32_t qkey, std::uint8_t port = 1, std::uint16_t pkey_index = 0) const noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port;
    a.pkey_index = pkey_index;
    a.qkey = qkey;
    return modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  }

  // INIT -> RTR for RC/UC: fixes the peer. UC has no responder resources or
  // RNR timer, so those attributes are left out for it (the verb rejects them).
  Expected<void> to_rtr(const RemoteQp& remote, const PathParams& p = {}) const noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = p.mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.ah_attr = global_route(remote.gid, p.port, p.sgid_index, p.hop_limit, remote.lid);
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type() == QpType::RC) {
      a.max_dest_rd_atomic = p.max_dest_rd_atomic;
      a.min_rnr_timer = p.min_rnr_timer;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    return modify(a, mask);
  }
  // INIT -> RTR for UD: nothing to say, every datagram names its destination.
  Expected<void> to_rtr() const noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    return modify(a, IBV_QP_STATE);
  }
  // RTR -> RTS: our first PSN; RC also takes its retry and RDMA READ limits.
  Expected<void> to_rts(std::uint32_t local_psn, const PathParams& p = {}) const noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = local_psn;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type() == QpType::RC) {
      a.timeout = p.timeout;
      a.retry_cnt = p.retry_cnt;
      a.rnr_retry = p.rnr_retry;
      a.max_rd_atomic = p.max_rd_atomic;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return modify(a, mask);
  }
  // RESET -> RTS for RC/UC in one call.
  Expected<void> connect(const RemoteQp& remote, std::uint32_t local_psn, Access remote_access,
                         const PathParams& p = {}) const noexcept {
    // Spelled out: GCC 12's std::expected has no and_then.
    if (auto r = to_init(remote_access, p.port); !r) return r;
    if (auto r = to_rtr(remote, p); !r) return r;
    return to_rts(local_psn, p);
  }

  // The raw posts. On failure `bad_wr` (when given) names the first request
  // that was not posted; those before it were.
  Expected<void> post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr = nullptr) const noexcept {
    ibv_send_wr* bad = nullptr;
    errno = 0;
    auto r = detail::check_rc(ibv_post_send(get(), &wr, &bad), "ibv_post_send");
    if (bad_wr) *bad_wr = bad;
    return r;
  }
  Expected<void> post_recv(ibv_recv_wr& wr, ibv_recv_wr** bad_wr = nullptr) const noexcept {
    ibv_recv_wr* bad = nullptr;
    errno = 0;
    auto r = detail::check_rc(ibv_post_recv(get(), &wr, &bad), "ibv_post_recv");
    if (bad_wr) *bad_wr = bad;
    return r;
  }

  // One-request conveniences. The sges are only read during the call.
  Expected<void> recv(std::span<const ibv_sge> sges, std::uint64_t wr_id) const noexcept {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sg_list(sges);
    wr.num_sge = static_cast<int>(sges.size());
    return post_recv(wr);
  }
  Expected<void> send(std::span<const ibv_sge> sges, std::uint64_t wr_id,
                      SendFlags flags = SendFlags::Signaled) const noexcept {
    ibv_send_wr wr = make_wr(IBV_WR_SEND, sges, wr_id, flags);
    return post_send(wr);
  }
  // A UD send to remote_qpn behind `ah`.
  Expected<void> send(std::span<const ibv_sge> sges, std::uint64_t wr_id, const AddressHandle& ah,
                      std::uint32_t remote_qpn, std::uint32_t remote_qkey,
                      SendFlags flags = SendFlags::Signaled) const noexcept {
    ibv_send_wr wr = make_wr(IBV_WR_SEND, sges, wr_id, flags);
    wr.wr.ud.ah = ah.get();
    wr.wr.ud.remote_qpn = remote_qpn;
    wr.wr.ud.remote_qkey = remote_qkey;
    return post_send(wr);
  }
  Expected<void> write(std::span<const ibv_sge> sges, std::uint64_t remote_addr, std::uint32_t rkey,
                       std::uint64_t wr_id, SendFlags flags = SendFlags::Signaled) const noexcept {
    ibv_send_wr wr = make_wr(IBV_WR_RDMA_WRITE, sges, wr_id, flags);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    return post_send(wr);
  }
  Expected<void> read(std::span<const ibv_sge> sges, std::uint64_t remote_addr, std::uint32_t rkey,
                      std::uint64_t wr_id, SendFlags flags = SendFlags::Signaled) const noexcept {
    ibv_send_wr wr = make_wr(IBV_WR_RDMA_READ, sges, wr_id, flags);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    return post_send(wr);
  }

 private:
  // The verbs never write through sg_list; its pointer is non-const only
  // because the C structs predate const-correctness.
  static ibv_sge* sg_list(std::span<const ibv_sge> sges) noexcept { return const_cast<ibv_sge*>(sges.data()); }

  static ibv_send_wr make_wr(ibv_wr_opcode op, std::span<const ibv_sge> sges, std::uint64_t wr_id,
                             SendFlags flags) noexcept {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = sg_list(sges);
    wr.num_sge = static_cast<int>(sges.size());
    wr.send_flags = std::to_underlying(flags);
    return wr;
  }
};

}  // namespace softhca
