// softhca C++ API: completion channel and completion queue.
#pragma once

#include <infiniband/verbs.h>

#include <span>

#include "device.hpp"
#include "error.hpp"
#include "handle.hpp"

namespace softhca {

namespace detail {
struct ChannelTraits {
  static constexpr const char* verb = "ibv_destroy_comp_channel";
  static int destroy(ibv_comp_channel* c) noexcept { return ibv_destroy_comp_channel(c); }
};
struct CqTraits {
  static constexpr const char* verb = "ibv_destroy_cq";
  static int destroy(ibv_cq* c) noexcept { return ibv_destroy_cq(c); }
};
}  // namespace detail

// Delivers "a CQ has a completion" events through a file descriptor. Destroy
// it after the CQs that use it (declare it before them).
class CompletionChannel : public detail::Handle<ibv_comp_channel, detail::ChannelTraits> {
 public:
  using Handle::Handle;

  static Expected<CompletionChannel> create(ibv_context* ctx) noexcept {
    errno = 0;
    auto c = detail::check_ptr(ibv_create_comp_channel(ctx), "ibv_create_comp_channel");
    if (!c) return std::unexpected(c.error());
    return CompletionChannel(*c);
  }
  static Expected<CompletionChannel> create(const Context& ctx) noexcept { return create(ctx.get()); }
  static CompletionChannel make(ibv_context* ctx) { return value_or_throw(create(ctx)); }
  static CompletionChannel make(const Context& ctx) { return value_or_throw(create(ctx)); }

  // For poll/epoll; make it nonblocking with fcntl to have get_event() return EAGAIN.
  int fd() const noexcept { return get()->fd; }

  // Waits for the next event and returns the CQ it is for (with the
  // cq_context given to CompletionQueue::create). Every event must be
  // acknowledged with CompletionQueue::ack_events before that CQ is destroyed,
  // or ibv_destroy_cq waits for it.
  Expected<ibv_cq*> get_event() const noexcept {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    errno = 0;
    if (auto r = detail::check_rc(ibv_get_cq_event(get(), &cq, &cq_ctx), "ibv_get_cq_event"); !r)
      return std::unexpected(r.error());
    return cq;
  }
};

class CompletionQueue : public detail::Handle<ibv_cq, detail::CqTraits> {
 public:
  using Handle::Handle;

  static Expected<CompletionQueue> create(ibv_context* ctx, int cqe, CompletionChannel* channel = nullptr,
                                          void* cq_context = nullptr, int comp_vector = 0) noexcept {
    errno = 0;
    auto c = detail::check_ptr(
        ibv_create_cq(ctx, cqe, cq_context, channel ? channel->get() : nullptr, comp_vector), "ibv_create_cq");
    if (!c) return std::unexpected(c.error());
    return CompletionQueue(*c);
  }
  static Expected<CompletionQueue> create(const Context& ctx, int cqe, CompletionChannel* channel = nullptr,
                                          void* cq_context = nullptr, int comp_vector = 0) noexcept {
    return create(ctx.get(), cqe, channel, cq_context, comp_vector);
  }
  static CompletionQueue make(ibv_context* ctx, int cqe, CompletionChannel* channel = nullptr,
                              void* cq_context = nullptr, int comp_vector = 0) {
    return value_or_throw(create(ctx, cqe, channel, cq_context, comp_vector));
  }
  static CompletionQueue make(const Context& ctx, int cqe, CompletionChannel* channel = nullptr,
                              void* cq_context = nullptr, int comp_vector = 0) {
    return value_or_throw(create(ctx, cqe, channel, cq_context, comp_vector));
  }

  // Fills the front of `wc` and returns that part (empty when nothing completed).
  Expected<std::span<ibv_wc>> poll(std::span<ibv_wc> wc) const noexcept {
    errno = 0;
    int n = ibv_poll_cq(get(), static_cast<int>(wc.size()), wc.data());
    // Providers return a negative value on error but do not agree on which
    // (-1, -errno, their own code), so errno is the more reliable report.
    if (n < 0) return std::unexpected(Error(detail::errno_or(EIO), "ibv_poll_cq"));
    return wc.first(static_cast<std::size_t>(n));
  }

  // Arms the CQ: the channel gets one event at the next (solicited) completion.
  Expected<void> req_notify(bool solicited_only = false) const noexcept {
    errno = 0;
    return detail::check_rc(ibv_req_notify_cq(get(), solicited_only ? 1 : 0), "ibv_req_notify_cq");
  }
  void ack_events(unsigned n) const noexcept { ibv_ack_cq_events(get(), n); }

  int capacity() const noexcept { return get()->cqe; }
};

}  // namespace softhca
