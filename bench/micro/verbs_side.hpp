// One verbs endpoint for the one-host micro benchmarks (post_cost.cpp,
// pingpong.cpp): a context on the first device, a PD, a CQ (or one for sends
// and one for receives), an RC QP with inline data and a registered, zeroed
// buffer, connected to a peer whose Endpoint arrives over a pipe. Any
// failure ends the program with the verb that failed.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bench {

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "%s failed: %s\n", what, std::strerror(errno));
  std::exit(1);
}

struct Endpoint {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  ibv_gid gid;
};

constexpr size_t kBuffer = 4096;

// What a side's queues hold: perftest's latency tests give receives a CQ of
// their own and keep 512 receives posted.
struct Shape {
  int max_recv_wr = 128;
  bool recv_cq_of_its_own = false;
};

// One side: a context, a PD, a CQ (recv_cq == cq unless the shape asked for
// its own), an RC QP and a registered buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  void* buffer = nullptr;
  ibv_gid gid{};

  explicit Side(Shape shape = {}) {
    int n = 0;
    ibv_device** devices = ibv_get_device_list(&n);
    if (devices == nullptr || n == 0) die("ibv_get_device_list (is softhca's libibverbs loaded?)");
    ctx = ibv_open_device(devices[0]);
    ibv_free_device_list(devices);
    if (ctx == nullptr) die("ibv_open_device");
    if ((pd = ibv_alloc_pd(ctx)) == nullptr) die("ibv_alloc_pd");
    if ((cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0)) == nullptr) die("ibv_create_cq");
    recv_cq = cq;
    if (shape.recv_cq_of_its_own && (recv_cq = ibv_create_cq(ctx, shape.max_recv_wr, nullptr, nullptr, 0)) == nullptr)
      die("ibv_create_cq");
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = recv_cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 128;
    init.cap.max_recv_wr = static_cast<uint32_t>(shape.max_recv_wr);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 64;
    if ((qp = ibv_create_qp(pd, &init)) == nullptr) die("ibv_create_qp");
    if (posix_memalign(&buffer, 4096, kBuffer) != 0) die("posix_memalign");
    std::memset(buffer, 0, kBuffer);
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                       IBV_ACCESS_REMOTE_ATOMIC;
    if ((mr = ibv_reg_mr(pd, buffer, kBuffer, access)) == nullptr) die("ibv_reg_mr");
    if (ibv_query_gid(ctx, 1, 0, &gid) != 0) die("ibv_query_gid");
  }

  Endpoint endpoint() const { return Endpoint{qp->qp_num, mr->rkey, reinterpret_cast<uint64_t>(buffer), gid}; }

  void connect(const Endpoint& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer.qpn;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC))
      die("RTS");
  }
};

}  // namespace bench
