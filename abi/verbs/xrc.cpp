// XRC domains (ibv_open_xrcd / ibv_close_xrcd) and ibv_open_qp. XRC SRQs are
// in srq.cpp, XRC QPs in qp.cpp.
#include <cerrno>

#include "engine/context.hpp"
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

// Sharing a TGT QP with another context or process is not offered: callers
// see the verb as unsupported.
ibv_qp* open_qp_op(ibv_context*, ibv_qp_open_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace softhca::abi
