// Protection domains and memory regions.
#include <cerrno>
#include <new>

#include "engine/context.hpp"
#include "engine/device_memory.hpp"
#include "engine/memory_region.hpp"
#include "engine/protection_domain.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace {

ibv_mr* register_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  return pointer_verb([&]() -> ibv_mr* {
    engine::ProtectionDomain* impl = to_pd(pd);
    if (impl == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto mr = engine::MemoryRegion::create(*impl, addr, length, iova, access);
    if (!mr) {
      errno = to_errno(mr.error());
      return nullptr;
    }
    auto* h = new MrHandle{};
    h->impl = *mr;
    h->mr.context = pd->context;
    h->mr.pd = pd;
    h->mr.addr = addr;
    h->mr.length = length;
    h->mr.handle = (*mr)->key();
    h->mr.lkey = (*mr)->key();
    h->mr.rkey = (*mr)->key();
    return &h->mr;
  });
}

}  // namespace

namespace softhca::abi {

// ibv_advise_mr (verbs_context op): prefetch advice for ranges of on-demand
// MRs. Checked as a provider checks it; there are no page faults to take
// ahead, so a valid request needs nothing more, flushed or not.
int advise_mr_op(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  return int_verb([&] {
    engine::ProtectionDomain* impl = to_pd(pd);
    if (impl == nullptr || sg_list == nullptr || num_sge == 0) return EINVAL;
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
      return EOPNOTSUPP;
    if (flags & ~uint32_t{IBV_ADVISE_MR_FLAG_FLUSH}) return EINVAL;
    const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
    for (uint32_t i = 0; i < num_sge; ++i) {
      if (auto ok = engine::check_advice_range(*impl, sg_list[i].lkey, sg_list[i].addr, sg_list[i].length, write);
          !ok)
        return to_errno(ok.error());
    }
    return 0;
  });
}

}  // namespace softhca::abi

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  return pointer_verb([&]() -> ibv_pd* {
    engine::Context* ctx = to_context(context);
    if (ctx == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    auto impl = engine::ProtectionDomain::create(*ctx);
    if (!impl) {
      errno = to_errno(impl.error());
      return nullptr;
    }
    auto* h = new PdHandle{};
    h->impl = *impl;
    h->pd.context = context;
    h->pd.handle = h->impl->id();
    return &h->pd;
  });
}

int ibv_dealloc_pd(ibv_pd* pd) {
  return int_verb([&] {
    engine::ProtectionDomain* impl = to_pd(pd);
    if (impl == nullptr) return EINVAL;
    if (is_parent_domain(pd)) return dealloc_parent_domain(pd);
    if (impl->in_use()) return EBUSY;
    if (impl->adopted()) {
      impl->context().destroy_adopted(impl);  // another process's PD: gone for all
    } else {
      delete impl;
    }
    delete reinterpret_cast<PdHandle*>(pd);
    return 0;
  });
}

// --- importing: another handle onto an object of the same device context
// (ibv_import_device), made in this process or in another that shares the
// context. Unimporting frees that handle only; destroying through it
// destroys the object, for every process, as the verbs man pages say.

ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  return pointer_verb([&]() -> ibv_pd* {
    engine::Context* ctx = to_context(context);
    engine::ProtectionDomain* impl = ctx ? ctx->find_pd(pd_handle) : nullptr;
    if (impl == nullptr) {
      errno = EINVAL;  // as the kernel answers a handle it does not know
      return nullptr;
    }
    auto* h = new PdHandle{};
    h->impl = impl;
    h->pd.context = context;
    h->pd.handle = pd_handle;
    return &h->pd;
  });
}

void ibv_unimport_pd(ibv_pd* pd) { delete reinterpret_cast<PdHandle*>(pd); }

ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  return pointer_verb([&]() -> ibv_mr* {
    engine::ProtectionDomain* impl_pd = to_pd(pd);
    engine::MemoryRegion* impl = impl_pd ? impl_pd->context().find_mr(mr_handle, *impl_pd) : nullptr;
    if (impl == nullptr) {
      errno = EINVAL;  // as the kernel answers a handle it does not know
      return nullptr;
    }
    auto* h = new MrHandle{};
    h->impl = impl;
    h->mr.context = pd->context;
    h->mr.pd = pd;
    h->mr.addr = nullptr;  // as rdma-core's import: the kernel does not say where the range is
    h->mr.length = impl->length();
    h->mr.handle = mr_handle;
    h->mr.lkey = impl->key();
    h->mr.rkey = impl->key();
    return &h->mr;
  });
}

void ibv_unimport_mr(ibv_mr* mr) { delete reinterpret_cast<MrHandle*>(mr); }

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return register_mr(pd, addr, length, reinterpret_cast<uint64_t>(addr), static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return register_mr(pd, addr, length, iova, static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  return register_mr(pd, addr, length, iova, access);
}

int ibv_dereg_mr(ibv_mr* mr) {
  return int_verb([&] {
    engine::MemoryRegion* impl = to_mr(mr);
    if (impl == nullptr) return EINVAL;
    if (auto ok = impl->deregister(); !ok) return to_errno(ok.error());
    engine::DeviceMemory* dm = reinterpret_cast<MrHandle*>(mr)->dm;
    if (impl->adopted()) {
      impl->pd().context().destroy_adopted(impl);
    } else {
      delete impl;
    }
    if (dm != nullptr) dm->detach();
    delete reinterpret_cast<MrHandle*>(mr);
    return 0;
  });
}

// ibv_rereg_mr has a convention of its own (its man page, rdma-core 44):
// IBV_REREG_MR_ERR_INPUT (-1) for input that libibverbs refuses before asking
// the provider, IBV_REREG_MR_ERR_CMD (-4) for what the provider (a kernel
// command; here the engine) refuses, and errno saying why in both. The MR is
// unchanged after either.
int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  const auto fail = [](int code, int err) {
    errno = err;
    return code;
  };
  try {
    engine::MemoryRegion* impl = to_mr(mr);
    if (impl == nullptr || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) != 0 ||
        ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (length == 0 || addr == nullptr)) ||
        (access != 0 && !(flags & IBV_REREG_MR_CHANGE_ACCESS)))
      return fail(IBV_REREG_MR_ERR_INPUT, EINVAL);
    engine::ProtectionDomain* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? to_pd(pd) : nullptr;
    if (auto ok = impl->rereg(flags, new_pd, addr, length, static_cast<uint32_t>(access)); !ok)
      return fail(IBV_REREG_MR_ERR_CMD, to_errno(ok.error()));
    if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
      mr->addr = addr;
      mr->length = length;
    }
    return 0;
  } catch (const std::bad_alloc&) {
    return fail(IBV_REREG_MR_ERR_CMD, ENOMEM);
  } catch (...) {
    return fail(IBV_REREG_MR_ERR_CMD, EIO);
  }
}

}  // extern "C"
