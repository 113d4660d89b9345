#include "engine/memory_region.hpp"

#include <infiniband/verbs.h>

#include "common/log.hpp"
#include "common/settings.hpp"
#include "engine/context.hpp"
#include "common/limits.hpp"
#include "engine/protection_domain.hpp"
#include "host/memory_check.hpp"
#include "link/registered_key.hpp"
#include "transport/memory_key.hpp"

namespace softhca::engine {

uint32_t supported_access_flags() {
  return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
         IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;
}

Result<void> check_access_flags(uint32_t access) {
  // Optional bits (relaxed ordering, ...) are hints a device may ignore.
  const uint32_t mandatory = access & ~static_cast<uint32_t>(IBV_ACCESS_OPTIONAL_RANGE);
  if (mandatory & ~supported_access_flags()) return fail(std::errc::invalid_argument);
  // Remote write or atomic access requires local write (IBTA; rdma-core returns EINVAL).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return fail(std::errc::invalid_argument);
  return {};
}

Result<void> check_advice_range(ProtectionDomain& pd, uint32_t lkey, uint64_t addr, uint64_t length, bool write) {
  Node& node = pd.context().node();
  host::MrRecord mr;
  if (!node.registry().lookup_mr(lkey, mr) || mr.proc != node.proc() || !(mr.access & IBV_ACCESS_ON_DEMAND))
    return fail(std::errc::invalid_argument);
  const transport::MemoryKey key = link::registered_key(mr);
  if (!transport::key_allows(key, pd.id(), write ? IBV_ACCESS_LOCAL_WRITE : 0, addr, length))
    return fail(std::errc::invalid_argument);
  return {};
}

// max_mr is the registry's key table, host-wide (allocate_mr: not_enough_memory).
static_assert(limits::kMaxMr == host::kMaxMrSlots, "max_mr must be what the host registry holds");

namespace {

// The range must be there with the protection the access needs, as the
// kernel's page pinning demands (EFAULT), and must not wrap (EINVAL): softhca
// reads and writes registered memory directly, so an MR over missing or
// read-only pages would fault inside the library at the first operation.
// Memory unmapped after registration is the application's bug, as with a NIC.
Result<void> check_memory(const void* addr, uint64_t length, uint32_t access) {
  auto ok = host::check_process_range(addr, length, host::memory_need(access));
  if (!ok && ok.error() == std::errc::bad_address)
    SOFTHCA_INFO("reg_mr: %p + %#llx is not mapped %s", addr, static_cast<unsigned long long>(length),
                 host::memory_need(access) == host::MemoryNeed::kWrite ? "writable" : "readable");
  return ok;
}

// Moves the MR's whole pages into the process's backing file so that peers
// on the host map them (SOFTHCA_SHARED_MR); memory that cannot move stays
// where it is and is reached by copying. What moved (empty: nothing).
host::SharedSpan share_pages(Node& node, void* addr, uint64_t length, std::optional<host::SharedPages>& out) {
  out.reset();
  if (setting_number(SettingId::kSharedMr) != 0) return host::SharedSpan{};
  auto& backing = host::MemoryBacking::process();
  auto pages = backing.share(addr, length);
  if (!pages) {
    if (pages.error() != std::errc::not_supported)
      SOFTHCA_DEBUG("reg_mr: %p + %#llx stays private: %s", addr, static_cast<unsigned long long>(length),
                    std::make_error_code(pages.error()).message().c_str());
    return host::SharedSpan{};
  }
  node.registry().publish_backing(node.proc(), static_cast<uint32_t>(backing.fd()),
                                  static_cast<uint64_t>(backing.inode()));
  out = *pages;
  return host::SharedSpan{pages->begin, pages->length, pages->offset};
}

}  // namespace

Result<MemoryRegion*> MemoryRegion::create(ProtectionDomain& pd, void* addr, uint64_t length, uint64_t iova,
                                           uint32_t access, bool empty_ok) {
  if (auto ok = check_access_flags(access); !ok) return fail(ok.error());
  // Implicit ODP: the whole address space, iova = address; nothing of it is
  // checked now, every reference through it is when used.
  const bool implicit = addr == nullptr && length == UINT64_MAX && (access & IBV_ACCESS_ON_DEMAND) != 0;
  const bool empty = empty_ok && length == 0 && addr != nullptr;
  if (implicit) {
    if (access & IBV_ACCESS_ZERO_BASED) return fail(std::errc::invalid_argument);
    iova = 0;
  } else if (!empty) {
    if (length == 0 || length > limits::kMaxMrSize) return fail(std::errc::invalid_argument);
    if (addr == nullptr) return fail(std::errc::invalid_argument);
    if (auto ok = check_memory(addr, length, access); !ok) return fail(ok.error());
  }
  auto* mr = new MemoryRegion(pd, addr, length, iova, access);
  Node& node = pd.context().node();
  // An on-demand MR follows the process's page table (a range unmapped and
  // mapped again is the new memory): its pages never move into the shared
  // file, peers reach them by copying.
  const host::SharedSpan shared = (access & IBV_ACCESS_ON_DEMAND) || empty
                                      ? host::SharedSpan{}
                                      : share_pages(node, addr, length, mr->shared_);
  auto key = node.registry().allocate_mr(node.proc(), pd.id(), access, iova, length,
                                         reinterpret_cast<uint64_t>(addr), shared);
  if (!key) {
    if (mr->shared_) host::MemoryBacking::process().unshare(*mr->shared_);
    delete mr;
    return fail(key.error());
  }
  mr->key_ = *key;
  mr->handle_ = *key;
  pd.attach();
  pd.context().publish(mr, mr->key_);  // for ibv_import_mr
  return mr;
}

MemoryRegion* MemoryRegion::adopt(ProtectionDomain& pd, const ExportRecord& record) {
  auto* mr = new MemoryRegion(pd, nullptr, record.length, record.iova, record.access);
  mr->key_ = record.handle;
  mr->handle_ = record.handle;
  mr->owner_proc_ = record.proc;
  return mr;
}

Result<void> MemoryRegion::deregister() {
  if (key_ == 0) return {};
  Node& node = pd_->context().node();
  if (adopted()) {
    // The other process's key goes for everyone; once this returns, no
    // initiator touches its memory through it.
    if (!node.registry().release_mr(key_, owner_proc_)) return fail(std::errc::invalid_argument);
    node.registry().fence_accesses(owner_proc_);
    key_ = 0;
    return {};
  }
  // (Released already if another process sharing the context deregistered
  // it through an imported handle: what is left here is ours to let go.)
  if (!node.registry().release_mr(key_, node.proc())) {
    SOFTHCA_INFO("dereg_mr: key 0x%x has memory windows bound to it", key_);
    return fail(std::errc::invalid_argument);
  }
  pd_->context().withdraw(this, key_);  // no more ibv_import_mr of it
  key_ = 0;
  // Once ibv_dereg_mr returns, no initiator touches the range: wait out the
  // accesses to our memory that may have validated the key before it went.
  node.registry().fence_accesses(node.proc());
  if (shared_) host::MemoryBacking::process().unshare(*shared_);
  pd_->detach();
  return {};
}

MemoryRegion::~MemoryRegion() {
  if (adopted()) return;  // a handle only: the MR is its registrant's
  if (key_ != 0 && !deregister()) {
    // Windows still bound (only a context torn down with them): the key stays
    // until the process ends rather than leave them pointing at freed pages.
    SOFTHCA_WARN("mr 0x%x destroyed with memory windows bound; its key stays registered", key_);
  }
}

Result<void> MemoryRegion::rereg(int flags, ProtectionDomain* pd, void* addr, uint64_t length, uint32_t access) {
  if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS) || flags == 0)
    return fail(std::errc::invalid_argument);
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS)) {
    if (auto ok = check_access_flags(access); !ok) return fail(ok.error());
  }
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr == nullptr || length == 0 || length > limits::kMaxMrSize))
    return fail(std::errc::invalid_argument);
  if ((flags & IBV_REREG_MR_CHANGE_PD) && pd == nullptr) return fail(std::errc::invalid_argument);
  // Another process's MR: its pages and their translation are that process's.
  if (adopted()) return fail(std::errc::operation_not_supported);
  // A bound window describes the MR's pages, rights and PD as they are.
  if (pd_->context().node().registry().windows_bound(key_)) return fail(std::errc::invalid_argument);
  // A new range, or new access that may need writable pages, is checked as a
  // registration is, before anything changes.
  if (flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS)) {
    void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : addr_;
    const uint64_t new_length = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : length_;
    const uint32_t new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : access_;
    if (auto ok = check_memory(new_addr, new_length, new_access); !ok) return fail(ok.error());
  }
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    pd_->detach();
    pd_ = pd;
    pd_->attach();
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) access_ = access;
  Node& node = pd_->context().node();
  std::optional<host::SharedPages> old_shared = shared_;
  host::SharedSpan shared = shared_ ? host::SharedSpan{shared_->begin, shared_->length, shared_->offset}
                                    : host::SharedSpan{};
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    addr_ = addr;
    length_ = length;
    iova_ = reinterpret_cast<uint64_t>(addr);
    if (access_ & IBV_ACCESS_ON_DEMAND) {
      shared_.reset();
      shared = host::SharedSpan{};
    } else {
      shared = share_pages(node, addr_, length_, shared_);
    }
  }
  node.registry().update_mr(key_, pd_->id(), access_, iova_, length_, reinterpret_cast<uint64_t>(addr_),
                            shared);
  pd_->context().publish(this, key_);  // importers see the new attributes
  // As for dereg: no access under the old translation or rights outlives the call.
  node.registry().fence_accesses(node.proc());
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && old_shared) host::MemoryBacking::process().unshare(*old_shared);
  return {};
}

}  // namespace softhca::engine
