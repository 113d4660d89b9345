#include "engine/context.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

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
  Node::release();
  if (found == nullptr) return fail(std::errc::no_such_device_or_address);
  return found;
}

void Context::release() {
  if (holders_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

Context::~Context() {
  if (node_ != nullptr && cmd_inode_ != 0) node_->remove_context(this);
  if (async_fd_ >= 0) ::close(async_fd_);
  if (cmd_fd_ >= 0) ::close(cmd_fd_);
  if (node_ != nullptr) Node::release();
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
