#include "engine/context.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "engine/device_memory.hpp"
#include "engine/memory_region.hpp"
#include "engine/protection_domain.hpp"

namespace softhca::engine {

Result<Context*> Context::open() {
  auto node = Node::acquire();
  if (!node) return fail(node.error());
  auto* ctx = new Context();
  ctx->node_ = *node;
  // EFD_SEMAPHORE: one read per event, so the fd stays readable while any is pending.
  ctx->async_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  // A file of its own (its inode names this context), so that a dup of it
  // can be handed to ibv_import_device.
  ctx->cmd_fd_ = ::memfd_create("softhca-context", MFD_CLOEXEC);
  struct stat st {};
  if (ctx->async_fd_ < 0 || ctx->cmd_fd_ < 0 || ::fstat(ctx->cmd_fd_, &st) != 0) {
    const int err = errno;
    delete ctx;
    return fail(static_cast<std::errc>(err));
  }
  auto file = ContextFile::create(ctx->cmd_fd_, ctx->node_->registry().identity_of(ctx->node_->proc()),
                                  ctx->node_->registry().file_identity());
  if (!file) {
    delete ctx;
    return fail(file.error());
  }
  ctx->file_ = *file;
  ctx->cmd_inode_ = st.st_ino;
  ctx->node_->add_context(ctx, ctx->cmd_inode_);
  return ctx;
}

Result<Context*> Context::import(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return fail(std::errc::bad_file_descriptor);
  auto node = Node::acquire();
  if (!node) return fail(node.error());
  Context* found = (*node)->hold_context(st.st_ino);
  if (found != nullptr) {
    Node::release();
    return found;
  }
  // Another process's context (or one closed here while others hold it):
  // a context of ours onto its file. PD ids and keys mean something only
  // in the registry they came from.
  auto file = ContextFile::attach(fd);
  if (!file) {
    Node::release();
    return fail(file.error());
  }
  // Its creator must be a live process of our registry (another Unix user,
  // or another mount namespace's /dev/shm, has a registry of its own).
  const uint64_t registry = (*node)->registry().file_identity();
  if (registry == 0 || (*file)->registry() != registry ||
      !(*node)->registry().process_alive((*file)->creator())) {
    (*file)->release();
    delete *file;
    Node::release();
    return fail(std::errc::no_such_device_or_address);
  }
  auto* ctx = new Context();
  ctx->node_ = *node;
  ctx->file_ = *file;
  ctx->async_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ctx->async_fd_ < 0) {
    const int err = errno;
    delete ctx;
    return fail(static_cast<std::errc>(err));
  }
  // Later imports here of the same file find this context.
  ctx->cmd_inode_ = st.st_ino;
  ctx->node_->add_context(ctx, ctx->cmd_inode_);
  return ctx;
}

void Context::release() {
  if (holders_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

Context::~Context() {
  if (node_ != nullptr && cmd_inode_ != 0) node_->remove_context(this);
  // Adopted objects are handles onto other processes' objects: they go
  // with this context, the objects stay (MRs first: they name their PD).
  for (MemoryRegion* mr : adopted_mrs_) delete mr;
  for (ProtectionDomain* pd : adopted_pds_) delete pd;
  for (DeviceMemory* dm : adopted_dms_) delete dm;
  if (file_ != nullptr) {
    file_->release();
    delete file_;
  }
  if (async_fd_ >= 0) ::close(async_fd_);
  if (cmd_fd_ >= 0) ::close(cmd_fd_);
  if (node_ != nullptr) Node::release();
}

void Context::publish(ProtectionDomain* pd, uint32_t handle) {
  publish_in(pds_, handle, pd);
  if (file_ != nullptr)
    file_->publish(ExportRecord{ExportKind::kPd, handle, node_->proc(), node_->host().pid(), 0, 0, 0, 0, 0});
}

void Context::withdraw(ProtectionDomain* pd, uint32_t handle) {
  withdraw_from(pds_, handle, pd);
  if (file_ != nullptr) file_->withdraw(ExportKind::kPd, handle);
}

void Context::publish(MemoryRegion* mr, uint32_t handle) {
  publish_in(mrs_, handle, mr);
  if (file_ != nullptr)
    file_->publish(ExportRecord{ExportKind::kMr, handle, node_->proc(), node_->host().pid(), mr->pd().id(),
                                mr->access(), mr->length(), mr->iova(), 0});
}

void Context::withdraw(MemoryRegion* mr, uint32_t handle) {
  withdraw_from(mrs_, handle, mr);
  if (file_ != nullptr) file_->withdraw(ExportKind::kMr, handle);
}

ProtectionDomain* Context::find_pd(uint32_t handle) {
  if (ProtectionDomain* pd = find_in(pds_, handle)) return pd;
  if (file_ == nullptr || !file_->find(ExportKind::kPd, handle)) return nullptr;
  std::lock_guard guard(objects_mutex_);
  if (auto it = pds_.find(handle); it != pds_.end()) return it->second;  // adopted meanwhile
  ProtectionDomain* pd = ProtectionDomain::adopt(*this, handle);
  pds_[handle] = pd;
  adopted_pds_.push_back(pd);
  return pd;
}

MemoryRegion* Context::find_mr(uint32_t handle, ProtectionDomain& pd) {
  if (MemoryRegion* mr = find_in(mrs_, handle)) return &mr->pd() == &pd ? mr : nullptr;
  if (file_ == nullptr) return nullptr;
  const std::optional<ExportRecord> record = file_->find(ExportKind::kMr, handle);
  if (!record || record->pd_handle != pd.id()) return nullptr;
  std::lock_guard guard(objects_mutex_);
  if (auto it = mrs_.find(handle); it != mrs_.end()) return &it->second->pd() == &pd ? it->second : nullptr;
  MemoryRegion* mr = MemoryRegion::adopt(pd, *record);
  mrs_[handle] = mr;
  adopted_mrs_.push_back(mr);
  return mr;
}

void Context::destroy_adopted(ProtectionDomain* pd) {
  if (file_ != nullptr) file_->withdraw(ExportKind::kPd, pd->id());
  {
    std::lock_guard guard(objects_mutex_);
    if (auto it = pds_.find(pd->id()); it != pds_.end() && it->second == pd) pds_.erase(it);
    std::erase(adopted_pds_, pd);
  }
  delete pd;
}

void Context::destroy_adopted(MemoryRegion* mr) {
  const uint32_t key = mr->handle();
  if (file_ != nullptr) file_->withdraw(ExportKind::kMr, key);
  {
    std::lock_guard guard(objects_mutex_);
    if (auto it = mrs_.find(key); it != mrs_.end() && it->second == mr) mrs_.erase(it);
    std::erase(adopted_mrs_, mr);
  }
  delete mr;
}

void Context::publish(DeviceMemory* dm, uint32_t handle, uint64_t offset) {
  publish_in(dms_, handle, dm);
  file_->publish(
      ExportRecord{ExportKind::kDm, handle, node_->proc(), node_->host().pid(), 0, 0, dm->length(), 0, offset});
}

DeviceMemory* Context::find_dm(uint32_t handle) {
  if (DeviceMemory* dm = find_in(dms_, handle)) return dm;
  const std::optional<ExportRecord> record = file_->find(ExportKind::kDm, handle);
  if (!record) return nullptr;
  std::lock_guard guard(objects_mutex_);
  if (auto it = dms_.find(handle); it != dms_.end()) return it->second;
  DeviceMemory* dm = DeviceMemory::adopt(*this, *record);
  dms_[handle] = dm;
  adopted_dms_.push_back(dm);
  return dm;
}

void Context::destroy_adopted(DeviceMemory* dm) {
  dm->free_everywhere();
  {
    std::lock_guard guard(objects_mutex_);
    if (auto it = dms_.find(dm->handle()); it != dms_.end() && it->second == dm) dms_.erase(it);
    std::erase(adopted_dms_, dm);
  }
  delete dm;
}

void Context::add_users(ExportKind kind, uint32_t handle, int delta) {
  file_->add_users(kind, handle, node_->registry().identity_of(node_->proc()), delta);
}

uint32_t Context::users_elsewhere(ExportKind kind, uint32_t handle) {
  host::HostRegistry& registry = node_->registry();
  return file_->users_elsewhere(kind, handle, node_->proc(),
                                [&](const host::ProcessIdentity& who) { return registry.process_alive(who); });
}

void Context::raise_async_event(const AsyncEvent& event) {
  // The count goes up under the lock too: forget_events, which takes an
  // event and its count back, must never run between the two (it found no
  // count to take, and the fd then stayed readable with no event behind it).
  std::lock_guard guard(mutex_);
  events_.push_back(event);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(async_fd_, &one, sizeof one);
}

Result<AsyncEvent> Context::get_async_event() {
  uint64_t value = 0;
  for (;;) {
    const ssize_t n = ::read(async_fd_, &value, sizeof value);
    if (n == sizeof value) break;
    if (n < 0 && errno == EINTR) continue;
    return fail(static_cast<std::errc>(n < 0 ? errno : EIO));
  }
  std::lock_guard guard(mutex_);
  if (events_.empty()) return fail(std::errc::resource_unavailable_try_again);
  AsyncEvent event = events_.front();
  events_.pop_front();
  return event;
}

void Context::forget_events(const void* handle) {
  std::lock_guard guard(mutex_);
  for (auto it = events_.begin(); it != events_.end();) {
    if (it->handle == handle) {
      it = events_.erase(it);
      // Take the event's count back off the eventfd so it does not stay readable.
      uint64_t value = 0;
      const int flags = ::fcntl(async_fd_, F_GETFL);
      ::fcntl(async_fd_, F_SETFL, flags | O_NONBLOCK);
      [[maybe_unused]] ssize_t n = ::read(async_fd_, &value, sizeof value);
      ::fcntl(async_fd_, F_SETFL, flags);
    } else {
      ++it;
    }
  }
}

}  // namespace softhca::engine
