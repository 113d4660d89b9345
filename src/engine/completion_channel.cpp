#include "engine/completion_channel.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace softhca::engine {

Result<CompletionChannel*> CompletionChannel::create() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  return new CompletionChannel(fd);
}

CompletionChannel::~CompletionChannel() { ::close(fd_); }

void CompletionChannel::signal(CompletionQueue& cq) {
  {
    std::lock_guard guard(mutex_);
    pending_.push_back(&cq);
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
}

Result<CompletionQueue*> CompletionChannel::get_event() {
  for (;;) {
    uint64_t value = 0;
    const ssize_t n = ::read(fd_, &value, sizeof value);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof value) return fail(static_cast<std::errc>(n < 0 ? errno : EIO));
    std::lock_guard guard(mutex_);
    // An event of a CQ destroyed meanwhile was dropped by forget(); read the next one.
    if (pending_.empty()) continue;
    CompletionQueue* cq = pending_.front();
    pending_.pop_front();
    return cq;
  }
}

void CompletionChannel::forget(CompletionQueue& cq) {
  std::lock_guard guard(mutex_);
  pending_.erase(std::remove(pending_.begin(), pending_.end(), &cq), pending_.end());
}

}  // namespace softhca::engine
