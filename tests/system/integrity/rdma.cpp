#include "rdma.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace integrity {
namespace {

std::string failed(const char* what, int err) { return std::string(what) + " failed: " + std::strerror(err); }

}  // namespace

Msg Endpoint::to_msg() const {
  Msg m;
  m.type = MsgType::kHello;
  m.w[0] = rc_qpn;
  m.w[1] = rc_psn;
  m.w[2] = uc_qpn;
  m.w[3] = uc_psn;
  m.w[4] = ud_qpn;
  m.w[5] = mtu;
  std::memcpy(&m.w[6], gid.raw, 16);  // raw bytes both ways: the peer copies them back alike
  m.w[8] = addr;
  m.w[9] = rkey;
  return m;
}

Endpoint Endpoint::from_msg(const Msg& m) {
  Endpoint e;
  e.rc_qpn = static_cast<uint32_t>(m.w[0]);
  e.rc_psn = static_cast<uint32_t>(m.w[1]);
  e.uc_qpn = static_cast<uint32_t>(m.w[2]);
  e.uc_psn = static_cast<uint32_t>(m.w[3]);
  e.ud_qpn = static_cast<uint32_t>(m.w[4]);
  e.mtu = static_cast<uint32_t>(m.w[5]);
  std::memcpy(e.gid.raw, &m.w[6], 16);
  e.addr = m.w[8];
  e.rkey = static_cast<uint32_t>(m.w[9]);
  return e;
}

std::expected<std::unique_ptr<Host>, std::string> Host::open(const RdmaOptions& options, uint64_t seed) {
  std::unique_ptr<Host> h(new Host);
  h->options_ = options;
  int ndev = 0;
  ibv_device** list = ibv_get_device_list(&ndev);
  if (list == nullptr || ndev == 0) {
    if (list) ibv_free_device_list(list);
    return std::unexpected("no RDMA device");
  }
  ibv_device* dev = nullptr;
  for (int i = 0; i < ndev; ++i) {
    if (options.device.empty() || options.device == ibv_get_device_name(list[i])) {
      dev = list[i];
      break;
    }
  }
  if (dev) h->ctx_ = ibv_open_device(dev);
  ibv_free_device_list(list);
  if (!dev) return std::unexpected("no device named " + options.device);
  if (!h->ctx_) return std::unexpected(failed("ibv_open_device", errno));

  ibv_device_attr dattr{};
  ibv_port_attr pattr{};
  if (int rc = ibv_query_device(h->ctx_, &dattr)) return std::unexpected(failed("ibv_query_device", rc));
  if (int rc = ibv_query_port(h->ctx_, 1, &pattr)) return std::unexpected(failed("ibv_query_port", rc));
  h->max_rd_atomic_ = static_cast<uint8_t>(std::min({16, dattr.max_qp_rd_atom, dattr.max_qp_init_rd_atom}));
  h->self_.mtu = 128u << pattr.active_mtu;
  if (ibv_query_gid(h->ctx_, 1, options.gid_index, &h->self_.gid) != 0) {
    return std::unexpected("no GID at index " + std::to_string(options.gid_index));
  }

  h->pd_ = ibv_alloc_pd(h->ctx_);
  if (!h->pd_) return std::unexpected(failed("ibv_alloc_pd", errno));
  h->send_cq_ = ibv_create_cq(h->ctx_, 4 * kQueueDepth, nullptr, nullptr, 0);
  h->recv_cq_ = ibv_create_cq(h->ctx_, 4 * kQueueDepth, nullptr, nullptr, 0);
  if (!h->send_cq_ || !h->recv_cq_) return std::unexpected(failed("ibv_create_cq", errno));
  h->buffer_.reset(new uint8_t[kBufferBytes]);
  std::memset(h->buffer_.get(), kGuard, kBufferBytes);
  h->mr_ = ibv_reg_mr(h->pd_, h->buffer_.get(), kBufferBytes,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
  if (!h->mr_) return std::unexpected(failed("ibv_reg_mr", errno));

  for (Transport t : {Transport::kRc, Transport::kUc, Transport::kUd}) {
    ibv_qp_init_attr init{};
    init.send_cq = h->send_cq_;
    init.recv_cq = h->recv_cq_;
    init.qp_type = t == Transport::kRc ? IBV_QPT_RC : t == Transport::kUc ? IBV_QPT_UC : IBV_QPT_UD;
    init.cap.max_send_wr = kQueueDepth;
    init.cap.max_recv_wr = kQueueDepth;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = 4;  // a UD receive: the GRH and three pieces
    ibv_qp* qp = ibv_create_qp(h->pd_, &init);
    if (!qp) return std::unexpected(failed("ibv_create_qp", errno));
    (t == Transport::kRc ? h->rc_ : t == Transport::kUc ? h->uc_ : h->ud_) = qp;
  }
  h->self_.rc_qpn = h->rc_->qp_num;
  h->self_.uc_qpn = h->uc_->qp_num;
  h->self_.ud_qpn = h->ud_->qp_num;
  // RC starts a few hundred packets short of 2^24, so its PSNs wrap early
  // in every run; UC anywhere.
  h->self_.rc_psn = options.rc_psn >= 0 ? static_cast<uint32_t>(options.rc_psn)
                                        : 0xFFFFFFu - static_cast<uint32_t>(mix(seed) % 300);
  h->self_.uc_psn = static_cast<uint32_t>(mix(seed + 1)) & 0xFFFFFFu;
  h->self_.addr = reinterpret_cast<uint64_t>(h->buffer_.get());
  h->self_.rkey = h->mr_->rkey;
  return h;
}

Host::~Host() {
  if (ah_) ibv_destroy_ah(ah_);
  for (ibv_qp* qp : {rc_, uc_, ud_}) {
    if (qp) ibv_destroy_qp(qp);
  }
  if (mr_) ibv_dereg_mr(mr_);
  if (send_cq_) ibv_destroy_cq(send_cq_);
  if (recv_cq_) ibv_destroy_cq(recv_cq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
}

ibv_qp* Host::qp(Transport t) const { return t == Transport::kRc ? rc_ : t == Transport::kUc ? uc_ : ud_; }

ibv_sge Host::sge(size_t offset, size_t length) const {
  return ibv_sge{addr(offset), static_cast<uint32_t>(length), mr_->lkey};
}

std::string Host::connect(const Endpoint& peer) {
  const uint32_t mtu = std::min(self_.mtu, peer.mtu);
  path_mtu_ = mtu;
  path_mtu_enum_ = mtu >= 4096 ? IBV_MTU_4096 : mtu >= 2048 ? IBV_MTU_2048 : mtu >= 1024 ? IBV_MTU_1024
                   : mtu >= 512 ? IBV_MTU_512 : IBV_MTU_256;
  ibv_ah_attr av{};
  av.is_global = 1;
  av.grh.dgid = peer.gid;
  av.grh.sgid_index = static_cast<uint8_t>(options_.gid_index);
  av.grh.hop_limit = 64;
  av.port_num = 1;

  for (ibv_qp* qp : {rc_, uc_}) {
    const bool rc = qp == rc_;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = rc ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_ATOMIC
                           : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
      return failed("modify to INIT", err);
    }
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = path_mtu_enum_;
    a.dest_qp_num = rc ? peer.rc_qpn : peer.uc_qpn;
    a.rq_psn = rc ? peer.rc_psn : peer.uc_psn;
    a.ah_attr = av;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (rc) {
      a.max_dest_rd_atomic = max_rd_atomic_;
      a.min_rnr_timer = 1;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    if (int err = ibv_modify_qp(qp, &a, mask)) return failed("modify to RTR", err);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = rc ? self_.rc_psn : self_.uc_psn;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (rc) {
      a.timeout = options_.qp_timeout;
      a.retry_cnt = options_.retry_cnt;
      a.rnr_retry = 7;
      a.max_rd_atomic = max_rd_atomic_;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    if (int err = ibv_modify_qp(qp, &a, mask)) return failed("modify to RTS", err);
  }

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (int err = ibv_modify_qp(ud_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) {
    return failed("modify UD to INIT", err);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (int err = ibv_modify_qp(ud_, &a, IBV_QP_STATE)) return failed("modify UD to RTR", err);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (int err = ibv_modify_qp(ud_, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return failed("modify UD to RTS", err);
  ah_ = ibv_create_ah(pd_, &av);
  if (!ah_) return failed("ibv_create_ah", errno);
  return {};
}

bool poll_cq(ibv_cq* cq, size_t n, std::vector<ibv_wc>& out, Clock::time_point deadline) {
  size_t got = 0;
  int idle = 0;
  while (got < n) {
    ibv_wc wc[16];
    const int k = ibv_poll_cq(cq, static_cast<int>(std::min<size_t>(16, n - got)), wc);
    if (k < 0) return false;
    if (k > 0) {
      out.insert(out.end(), wc, wc + k);
      got += static_cast<size_t>(k);
      idle = 0;
      continue;
    }
    if (Clock::now() >= deadline) return false;
    // A few quick polls for the common short wait, then sleep.
    if (++idle > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

const char* wc_opcode_name(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "other";
  }
}

std::string describe(const ibv_wc& wc) {
  char text[200];
  std::snprintf(text, sizeof text, "wr_id 0x%llx, status %d (%s), opcode %s, byte_len %u",
                static_cast<unsigned long long>(wc.wr_id), static_cast<int>(wc.status), ibv_wc_status_str(wc.status),
                wc_opcode_name(wc.opcode), wc.byte_len);
  return text;
}

}  // namespace integrity
