// XRC helpers for the loopback tests: an XRC domain, an XRC SRQ, TGT and INI
// QPs and their way to RTS, through the public verbs API.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>

#include <cstdint>

#include "loopback.hpp"

namespace loopback::xrc {

inline ibv_xrcd* open_xrcd(ibv_context* ctx, int fd, int oflags) {
  ibv_xrcd_init_attr attr{};
  attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  attr.fd = fd;
  attr.oflags = oflags;
  return ibv_open_xrcd(ctx, &attr);
}

inline ibv_srq* create_xrc_srq(ibv_context* ctx, ibv_pd* pd, ibv_xrcd* xrcd, ibv_cq* cq, uint32_t max_wr = 16) {
  ibv_srq_init_attr_ex attr{};
  attr.attr.max_wr = max_wr;
  attr.attr.max_sge = 1;
  attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  attr.srq_type = IBV_SRQT_XRC;
  attr.pd = pd;
  attr.xrcd = xrcd;
  attr.cq = cq;
  return ibv_create_srq_ex(ctx, &attr);
}

inline ibv_qp* create_tgt(ibv_context* ctx, ibv_xrcd* xrcd) {
  ibv_qp_init_attr_ex init{};
  init.qp_type = IBV_QPT_XRC_RECV;
  init.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  init.xrcd = xrcd;
  return ibv_create_qp_ex(ctx, &init);
}

// ibv_open_qp: another handle to TGT QP `qpn` of the domain.
inline ibv_qp* open_tgt(ibv_context* ctx, ibv_xrcd* xrcd, uint32_t qpn, void* qp_context = nullptr) {
  ibv_qp_open_attr attr{};
  attr.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE | IBV_QP_OPEN_ATTR_CONTEXT;
  attr.qp_num = qpn;
  attr.xrcd = xrcd;
  attr.qp_type = IBV_QPT_XRC_RECV;
  attr.qp_context = qp_context;
  return ibv_open_qp(ctx, &attr);
}

using loopback::post_srq_recv;

inline ibv_qp* create_ini(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr_ex init{};
  init.qp_type = IBV_QPT_XRC_SEND;
  init.send_cq = cq;
  init.cap.max_send_wr = 64;
  init.cap.max_send_sge = 1;
  init.comp_mask = IBV_QP_INIT_ATTR_PD;
  init.pd = pd;
  return ibv_create_qp_ex(ctx, &init);
}

inline int to_init(ibv_qp* qp, int access) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = access;
  return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

inline int to_rtr(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& gid, bool responder) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_1024;
  attr.dest_qp_num = dest_qpn;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = gid;
  attr.ah_attr.grh.hop_limit = 64;
  attr.ah_attr.port_num = 1;
  attr.max_dest_rd_atomic = 4;
  attr.min_rnr_timer = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (responder) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return ibv_modify_qp(qp, &attr, mask);
}

inline int ini_to_rts(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;  // 67 ms, retried 7 times: a loaded machine over the udp link too
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.max_rd_atomic = 4;
  return ibv_modify_qp(qp, &attr,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

}  // namespace loopback::xrc
