// Thread domains and parent domains (ibv_alloc_td, ibv_alloc_parent_domain).
//
// A parent domain stands for its protection domain everywhere a PD is taken
// (QPs, SRQs, MRs, AHs) and is what ibv_create_cq_ex's
// IBV_CQ_INIT_ATTR_MASK_PD wants. Its custom allocators are accepted and
// never called: softhca's queues live in its shared segment, which an
// application allocator could not provide (a provider decides which of its
// buffers, if any, come from them). A PD cannot be deallocated while a parent
// domain refers to it, nor a thread domain while a parent domain uses it
// (EBUSY, as mlx5 answers). Unlike mlx5, a parent domain is not pinned by
// the objects made through it: they hold its protection domain, which stays.
#include <cerrno>

#include "engine/protection_domain.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {

ibv_td* alloc_td_op(ibv_context* context, ibv_td_init_attr* init_attr) {
  return pointer_verb([&]() -> ibv_td* {
    if (to_context(context) == nullptr || init_attr == nullptr || init_attr->comp_mask != 0) {
      errno = EINVAL;
      return nullptr;
    }
    auto* h = new TdHandle{};
    h->td.context = context;
    return &h->td;
  });
}

int dealloc_td_op(ibv_td* td) {
  return int_verb([&] {
    auto* h = reinterpret_cast<TdHandle*>(td);
    if (h->parent_domains.load() != 0) return EBUSY;
    delete h;
    return 0;
  });
}

ibv_pd* alloc_parent_domain_op(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  return pointer_verb([&]() -> ibv_pd* {
    constexpr uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if (to_context(context) == nullptr || attr == nullptr || (attr->comp_mask & ~kKnown) != 0 ||
        attr->pd == nullptr || attr->pd->context != context || is_parent_domain(attr->pd) ||
        (attr->td != nullptr && attr->td->context != context)) {
      errno = EINVAL;
      return nullptr;
    }
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) != 0 &&
        (attr->alloc == nullptr || attr->free == nullptr)) {
      errno = EINVAL;
      return nullptr;
    }
    auto* h = new PdHandle{};
    h->impl = to_pd(attr->pd);
    h->parent_domain = true;
    h->td = reinterpret_cast<TdHandle*>(attr->td);
    h->pd.context = context;
    h->pd.handle = attr->pd->handle;
    h->impl->attach();  // the protection domain stays while the parent does
    if (h->td != nullptr) h->td->parent_domains.fetch_add(1);
    return &h->pd;
  });
}

int dealloc_parent_domain(ibv_pd* pd) {
  auto* h = reinterpret_cast<PdHandle*>(pd);
  h->impl->detach();
  if (h->td != nullptr) h->td->parent_domains.fetch_sub(1);
  delete h;
  return 0;
}

}  // namespace softhca::abi
