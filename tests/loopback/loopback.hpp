// Helpers for the loopback tests: a device context with a PD, QPs of every
// connected type brought up in one process, registered buffers, seeded byte
// patterns, and bounded waits (CQ polls, async events, fds) that give up after
// a deadline instead of hanging. Public verbs API only.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace loopback {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// How long a test waits for something that should happen at once.
inline constexpr Millis kDeadline{5000};

// A context and a PD on the first (only) device, and its GID 0 (127.0.0.1).
class Device {
 public:
  Device() {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (list == nullptr || num < 1) {
      if (list) ibv_free_device_list(list);
      return;
    }
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) return;
    pd = ibv_alloc_pd(ctx);
    if (ibv_query_gid(ctx, 1, 0, &gid) != 0) std::memset(&gid, 0, sizeof gid);
  }
  ~Device() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  bool ok() const { return ctx != nullptr && pd != nullptr; }

  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};
};

// A heap buffer registered as one MR.
class Buffer {
 public:
  Buffer(ibv_pd* pd, size_t size, int access = kAllAccess, uint8_t fill = 0) : bytes_(size ? size : 1, fill) {
    mr_ = ibv_reg_mr(pd, bytes_.data(), bytes_.size(), access);
  }
  ~Buffer() {
    if (mr_) ibv_dereg_mr(mr_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  static constexpr int kAllAccess =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

  ibv_mr* mr() const { return mr_; }
  uint8_t* data() { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  uint64_t addr(size_t offset = 0) { return reinterpret_cast<uint64_t>(bytes_.data() + offset); }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  ibv_sge sge(size_t offset, uint32_t length) { return ibv_sge{addr(offset), length, lkey()}; }
  std::span<uint8_t> span(size_t offset, size_t length) { return {bytes_.data() + offset, length}; }

 private:
  std::vector<uint8_t> bytes_;
  ibv_mr* mr_ = nullptr;
};

// Bytes from a seeded PRNG: the same seed gives the same bytes.
inline void fill_pattern(std::span<uint8_t> out, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

// Index of the first byte that differs, or -1.
inline long first_mismatch(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}
inline long first_not(std::span<const uint8_t> a, uint8_t value) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != value) return static_cast<long>(i);
  return -1;
}

// The knobs of a QP and its connection.
struct QpConfig {
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t max_send_wr = 64;
  uint32_t max_recv_wr = 64;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 0;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  uint8_t timeout = 14;  // 67 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 10 us
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  uint32_t qkey = 0x11111111;  // UD
  bool sq_sig_all = false;
};

inline ibv_qp* create_qp(ibv_pd* pd, ibv_cq* send_cq, ibv_cq* recv_cq, const QpConfig& cfg,
                         ibv_srq* srq = nullptr) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq;
  init.recv_cq = recv_cq;
  init.srq = srq;
  init.qp_type = cfg.type;
  init.sq_sig_all = cfg.sq_sig_all ? 1 : 0;
  init.cap.max_send_wr = cfg.max_send_wr;
  init.cap.max_recv_wr = srq ? 0 : cfg.max_recv_wr;
  init.cap.max_send_sge = cfg.max_send_sge;
  init.cap.max_recv_sge = srq ? 0 : cfg.max_recv_sge;
  init.cap.max_inline_data = cfg.max_inline_data;
  return ibv_create_qp(pd, &init);
}

inline int qp_to_init(ibv_qp* qp, const QpConfig& cfg) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  if (cfg.type == IBV_QPT_UD) {
    attr.qkey = cfg.qkey;
    return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  }
  attr.qp_access_flags = cfg.access;
  return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

inline int qp_to_rtr(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& dgid, const QpConfig& cfg) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  if (cfg.type == IBV_QPT_UD) return ibv_modify_qp(qp, &attr, IBV_QP_STATE);
  attr.path_mtu = IBV_MTU_4096;
  attr.dest_qp_num = dest_qpn;
  attr.rq_psn = 0;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = dgid;
  attr.ah_attr.grh.sgid_index = 0;
  attr.ah_attr.grh.hop_limit = 64;
  attr.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (cfg.type == IBV_QPT_RC) {
    attr.max_dest_rd_atomic = cfg.max_dest_rd_atomic;
    attr.min_rnr_timer = cfg.min_rnr_timer;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return ibv_modify_qp(qp, &attr, mask);
}

inline int qp_to_rts(ibv_qp* qp, const QpConfig& cfg) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = 0;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (cfg.type == IBV_QPT_RC) {
    attr.timeout = cfg.timeout;
    attr.retry_cnt = cfg.retry_cnt;
    attr.rnr_retry = cfg.rnr_retry;
    attr.max_rd_atomic = cfg.max_rd_atomic;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &attr, mask);
}

// RESET -> INIT -> RTR -> RTS towards `dest_qpn` (ignored for UD); 0 or the failing errno.
inline int bring_up(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& dgid, const QpConfig& cfg) {
  if (int rc = qp_to_init(qp, cfg)) return rc;
  if (int rc = qp_to_rtr(qp, dest_qpn, dgid, cfg)) return rc;
  return qp_to_rts(qp, cfg);
}

inline ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) != 0) return IBV_QPS_UNKNOWN;
  return attr.qp_state;
}

// Two QPs of one type in one process, each with its own send and receive CQ,
// connected to each other (RC/UC) or both ready (UD): `a` usually sends, `b` receives.
class QpPair {
 public:
  // `b_recv_channel`: a completion channel for b's receive CQ (none by default).
  QpPair(Device& dev, const QpConfig& cfg_a, const QpConfig& cfg_b, int cqe = 256,
         ibv_comp_channel* b_recv_channel = nullptr)
      : dev_(dev), cfg_a(cfg_a), cfg_b(cfg_b) {
    a_send_cq = ibv_create_cq(dev.ctx, cqe, nullptr, nullptr, 0);
    a_recv_cq = ibv_create_cq(dev.ctx, cqe, nullptr, nullptr, 0);
    b_send_cq = ibv_create_cq(dev.ctx, cqe, nullptr, nullptr, 0);
    b_recv_cq = ibv_create_cq(dev.ctx, cqe, this, b_recv_channel, 0);
    if (!a_send_cq || !a_recv_cq || !b_send_cq || !b_recv_cq) return;
    a = create_qp(dev.pd, a_send_cq, a_recv_cq, cfg_a);
    b = create_qp(dev.pd, b_send_cq, b_recv_cq, cfg_b);
    if (!a || !b) return;
    up_ = bring_up(a, b->qp_num, dev.gid, cfg_a) == 0 && bring_up(b, a->qp_num, dev.gid, cfg_b) == 0;
  }
  QpPair(Device& dev, const QpConfig& cfg, int cqe = 256) : QpPair(dev, cfg, cfg, cqe) {}
  ~QpPair() {
    if (a) ibv_destroy_qp(a);
    if (b) ibv_destroy_qp(b);
    for (ibv_cq* cq : {a_send_cq, a_recv_cq, b_send_cq, b_recv_cq})
      if (cq) ibv_destroy_cq(cq);
  }
  QpPair(const QpPair&) = delete;
  QpPair& operator=(const QpPair&) = delete;
  bool ok() const { return up_; }
  // Destroys b now (to play a peer that went away).
  void destroy_b() {
    if (b) ibv_destroy_qp(b);
    b = nullptr;
  }

  Device& dev_;
  QpConfig cfg_a, cfg_b;
  ibv_cq* a_send_cq = nullptr;
  ibv_cq* a_recv_cq = nullptr;
  ibv_cq* b_send_cq = nullptr;
  ibv_cq* b_recv_cq = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;

 private:
  bool up_ = false;
};

// Polls until `n` completions arrived or the deadline passed; returns what it got.
inline std::vector<ibv_wc> poll_n(ibv_cq* cq, size_t n, Millis deadline = kDeadline) {
  std::vector<ibv_wc> out;
  const auto until = Clock::now() + deadline;
  ibv_wc wc[16];
  while (out.size() < n) {
    const int want = static_cast<int>(std::min<size_t>(16, n - out.size()));
    const int got = ibv_poll_cq(cq, want, wc);
    if (got < 0) break;
    for (int i = 0; i < got; ++i) out.push_back(wc[i]);
    if (got == 0 && Clock::now() > until) break;
  }
  return out;
}

// One completion within the deadline.
inline bool poll_one(ibv_cq* cq, ibv_wc* wc, Millis deadline = kDeadline) {
  const auto until = Clock::now() + deadline;
  for (;;) {
    const int got = ibv_poll_cq(cq, 1, wc);
    if (got == 1) return true;
    if (got < 0 || Clock::now() > until) return false;
  }
}

// True if no completion shows up for `window` (what a test expects when nothing must happen).
inline bool stays_empty(ibv_cq* cq, Millis window) {
  const auto until = Clock::now() + window;
  ibv_wc wc;
  while (Clock::now() < until) {
    if (ibv_poll_cq(cq, 1, &wc) != 0) return false;
  }
  return true;
}

inline bool fd_readable(int fd, Millis timeout) {
  pollfd p{fd, POLLIN, 0};
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now()).count();
    const int rc = ::poll(&p, 1, left > 0 ? static_cast<int>(left) : 0);
    if (rc > 0) return (p.revents & POLLIN) != 0;
    if (rc == 0 || (rc < 0 && errno != EINTR)) return false;
  }
}

// Waits for the next async event of the context (poll() on async_fd, then
// ibv_get_async_event); the caller must ibv_ack_async_event it.
inline bool next_async_event(ibv_context* ctx, ibv_async_event* event, Millis timeout = kDeadline) {
  if (!fd_readable(ctx->async_fd, timeout)) return false;
  return ibv_get_async_event(ctx, event) == 0;
}

// Waits for an async event of `type`, acking (and skipping) any other; true if found.
// The matching event is acked too; `element` receives its element union.
inline bool wait_async_event(ibv_context* ctx, ibv_event_type type, decltype(ibv_async_event::element)* element,
                             Millis timeout = kDeadline) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    if (left.count() <= 0) return false;
    ibv_async_event event;
    if (!next_async_event(ctx, &event, left)) return false;
    const bool match = event.event_type == type;
    if (match && element) *element = event.element;
    ibv_ack_async_event(&event);
    if (match) return true;
  }
}

// Acks every pending async event (so destroy never waits on one).
inline void drain_async_events(ibv_context* ctx) {
  ibv_async_event event;
  while (next_async_event(ctx, &event, Millis{0})) ibv_ack_async_event(&event);
}

inline std::string wc_str(const ibv_wc& wc) {
  return std::string("wr_id=") + std::to_string(wc.wr_id) + " status=" + ibv_wc_status_str(wc.status) +
         " opcode=" + std::to_string(wc.opcode) + " byte_len=" + std::to_string(wc.byte_len) +
         " qp_num=" + std::to_string(wc.qp_num);
}

// Posts one WR; returns ibv_post_send's result.
inline int post_send(ibv_qp* qp, ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}
// The QP's capabilities as ibv_query_qp reports them; all zero if the query
// fails, which the caller's check of the number it needs then catches.
inline ibv_qp_cap caps_of(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_CAP, &init) != 0) return ibv_qp_cap{};
  return init.cap;
}

inline int post_recv(ibv_qp* qp, uint64_t wr_id, ibv_sge* sges, int num_sge) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges;
  wr.num_sge = num_sge;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

inline int post_srq_recv(ibv_srq* srq, uint64_t wr_id, ibv_sge sge) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_srq_recv(srq, &wr, &bad);
}

inline ibv_send_wr make_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sges, int num_sge,
                           unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.sg_list = sges;
  wr.num_sge = num_sge;
  wr.send_flags = flags;
  return wr;
}

}  // namespace loopback
