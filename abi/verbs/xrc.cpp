// XRC domains (ibv_open_xrcd / ibv_close_xrcd) and ibv_open_qp. XRC SRQs are
// in srq.cpp, XRC QPs in qp.cpp.
#include <cerrno>

#include "engine/context.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/xrc_domain.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {

ibv_xrcd* open_xrcd_op(ibv_context* context, ibv_xrcd_init_attr* attr) {
  return pointer_verb([&]() -> ibv_xrcd* {
    engine::Context* ctx = to_context(context);
    if (ctx == nullptr || attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    if (attr->comp_mask & ~uint32_t{IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS}) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    // rdma-core asks for both: the file (or -1) and how to open its domain.
    if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS)) {
      errno = EINVAL;
      return nullptr;
    }
    auto xrcd = engine::XrcDomain::open(*ctx, attr->fd, attr->oflags);
    if (!xrcd) {
      errno = to_errno(xrcd.error());
      return nullptr;
    }
    auto* h = new XrcdHandle{};
    h->xrcd.context = context;
    h->impl = *xrcd;
    return &h->xrcd;
  });
}

int close_xrcd_op(ibv_xrcd* xrcd) {
  return int_verb([&] {
    engine::XrcDomain* impl = to_xrcd(xrcd);
    if (impl == nullptr) return EINVAL;
    if (impl->in_use()) return EBUSY;  // SRQs or TGT QPs still in it
    delete impl;
    delete reinterpret_cast<XrcdHandle*>(xrcd);
    return 0;
  });
}

// ibv_open_qp: another handle to an XRC TGT QP of the domain, which any
// process of the host may have created (engine/qp/tgt_qp.cpp). The checks
// are rdma-core's (the number, domain and type are required) and the
// kernel's (a TGT QP of that domain, with that number): EINVAL otherwise.
ibv_qp* open_qp_op(ibv_context* context, ibv_qp_open_attr* attr) {
  return pointer_verb([&]() -> ibv_qp* {
    engine::Context* ctx = to_context(context);
    if (ctx == nullptr || attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    constexpr uint32_t kRequired = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    if ((attr->comp_mask & kRequired) != kRequired || attr->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED ||
        attr->qp_type != IBV_QPT_XRC_RECV) {
      errno = EINVAL;
      return nullptr;
    }
    engine::XrcDomain* xrcd = to_xrcd(attr->xrcd);
    if (xrcd == nullptr || &xrcd->context() != ctx) {
      errno = EINVAL;
      return nullptr;
    }
    auto qp = engine::QueuePair::open(*ctx, *xrcd, attr->qp_num);
    if (!qp) {
      errno = to_errno(qp.error());
      return nullptr;
    }
    return adopt_qp(*qp, context, attr->qp_context);
  });
}

}  // namespace softhca::abi
