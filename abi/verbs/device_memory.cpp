// Device memory: ibv_alloc_dm, ibv_free_dm, ibv_reg_dm_mr and the copy
// functions that ibv_memcpy_to_dm / ibv_memcpy_from_dm call through struct
// ibv_dm, and ibv_import_dm.
#include <cerrno>

#include "engine/context.hpp"
#include "engine/device_memory.hpp"
#include "engine/memory_region.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

namespace softhca::abi {
namespace {

int memcpy_to_dm(ibv_dm* dm, uint64_t dm_offset, const void* host_addr, size_t length) {
  return int_verb([&] {
    engine::DeviceMemory* impl = to_dm(dm);
    if (impl == nullptr || (host_addr == nullptr && length != 0)) return EINVAL;
    auto ok = impl->copy_to(dm_offset, host_addr, length);
    return ok ? 0 : to_errno(ok.error());
  });
}

int memcpy_from_dm(void* host_addr, ibv_dm* dm, uint64_t dm_offset, size_t length) {
  return int_verb([&] {
    engine::DeviceMemory* impl = to_dm(dm);
    if (impl == nullptr || (host_addr == nullptr && length != 0)) return EINVAL;
    auto ok = impl->copy_from(host_addr, dm_offset, length);
    return ok ? 0 : to_errno(ok.error());
  });
}

ibv_dm* make_dm_handle(ibv_context* context, engine::DeviceMemory* impl) {
  auto* h = new DmHandle{};
  h->impl = impl;
  h->dm.context = context;
  h->dm.memcpy_to_dm = memcpy_to_dm;
  h->dm.memcpy_from_dm = memcpy_from_dm;
  h->dm.handle = impl->handle();
  return &h->dm;
}

}  // namespace

ibv_dm* alloc_dm_op(ibv_context* context, ibv_alloc_dm_attr* attr) {
  return pointer_verb([&]() -> ibv_dm* {
    engine::Context* ctx = to_context(context);
    // No attribute beyond length and alignment exists: any comp_mask bit is unknown.
    if (ctx == nullptr || attr == nullptr || attr->comp_mask != 0) {
      errno = EINVAL;
      return nullptr;
    }
    auto dm = engine::DeviceMemory::allocate(*ctx, attr->length, attr->log_align_req);
    if (!dm) {
      errno = to_errno(dm.error());
      return nullptr;
    }
    return make_dm_handle(context, *dm);
  });
}

int free_dm_op(ibv_dm* dm) {
  return int_verb([&] {
    engine::DeviceMemory* impl = to_dm(dm);
    if (impl == nullptr) return EINVAL;
    if (impl->in_use()) return EBUSY;  // an MR still registers it
    if (impl->adopted()) {
      impl->context().destroy_adopted(impl);  // another process's DM: freed for all
    } else {
      delete impl;
    }
    delete reinterpret_cast<DmHandle*>(dm);
    return 0;
  });
}

// A DM MR is zero-based: its addresses count from `dm_offset` of the DM. It
// may be empty, as the kernel lets it be.
ibv_mr* reg_dm_mr_op(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length, unsigned int access) {
  return pointer_verb([&]() -> ibv_mr* {
    engine::ProtectionDomain* impl_pd = to_pd(pd);
    engine::DeviceMemory* impl_dm = to_dm(dm);
    if (impl_pd == nullptr || impl_dm == nullptr || !(access & IBV_ACCESS_ZERO_BASED) ||
        (access & IBV_ACCESS_ON_DEMAND) || !impl_dm->holds(dm_offset, length)) {
      errno = EINVAL;
      return nullptr;
    }
    void* addr = static_cast<char*>(impl_dm->base()) + dm_offset;
    auto mr = engine::MemoryRegion::create(*impl_pd, addr, length, 0, access, /*empty_ok=*/true);
    if (!mr) {
      errno = to_errno(mr.error());
      return nullptr;
    }
    impl_dm->attach();
    auto* h = new MrHandle{};
    h->impl = *mr;
    h->dm = impl_dm;
    h->mr.context = pd->context;
    h->mr.pd = pd;
    h->mr.addr = reinterpret_cast<void*>(dm_offset);
    h->mr.length = length;
    h->mr.handle = (*mr)->key();
    h->mr.lkey = (*mr)->key();
    h->mr.rkey = (*mr)->key();
    return &h->mr;
  });
}

}  // namespace softhca::abi

using namespace softhca::abi;

extern "C" {

// Another handle onto a DM of the same device context (ibv_import_device).
ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  return pointer_verb([&]() -> ibv_dm* {
    softhca::engine::Context* ctx = to_context(context);
    softhca::engine::DeviceMemory* impl = ctx ? ctx->find_dm(dm_handle) : nullptr;
    if (impl == nullptr) {
      errno = EINVAL;  // as the kernel answers a handle it does not know
      return nullptr;
    }
    return make_dm_handle(context, impl);
  });
}

void ibv_unimport_dm(ibv_dm* dm) { delete reinterpret_cast<DmHandle*>(dm); }

}  // extern "C"
