// A completion channel: a real eventfd that is readable while completion events
// are pending. ibv_get_cq_event reads one event and names its CQ.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>

#include "common/result.hpp"

namespace softhca::engine {

class CompletionQueue;

class CompletionChannel {
 public:
  static Result<CompletionChannel*> create();
  ~CompletionChannel();

  int fd() const { return fd_; }
  void signal(CompletionQueue& cq);
  // Blocks unless the application made the fd non-blocking (then EAGAIN).
  Result<CompletionQueue*> get_event();
  // Drops pending events of a CQ being destroyed.
  void forget(CompletionQueue& cq);

  void attach() { users_.fetch_add(1); }
  void detach() { users_.fetch_sub(1); }
  bool in_use() const { return users_.load() != 0; }

 private:
  explicit CompletionChannel(int fd) : fd_(fd) {}
  int fd_;
  std::mutex mutex_;
  std::deque<CompletionQueue*> pending_;
  std::atomic<uint32_t> users_{0};
};

}  // namespace softhca::engine
