#include "engine/context.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
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
  ctx->cmd_fd_ = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (ctx->async_fd_ < 0 || ctx->cmd_fd_ < 0) {
    const int err = errno;
    delete ctx;
    return fail(static_cast<std::errc>(err));
  }
  return ctx;
}

Context::~Context() {
  if (async_fd_ >= 0) ::close(async_fd_);
  if (cmd_fd_ >= 0) ::close(cmd_fd_);
  if (node_ != nullptr) Node::release();
}

void Context::raise_async_event(const AsyncEvent& event) {
  {
    std::lock_guard guard(mutex_);
    events_.push_back(event);
  }
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
