// Event channels and events: queuing, handing out, acknowledging, moving an
// id to another channel, and closing a channel with ids still on it.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "cm/service.hpp"

namespace softhca::cm {

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::shared_ptr<Channel>> Service::create_channel() {
  auto ch = std::make_shared<Channel>();
  ch->fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (ch->fd_ < 0) return fail(static_cast<std::errc>(errno));
  return ch;
}

void Service::push_event_locked(Channel* ch, Event ev) {
  ch->queue_.push_back(ev);
  if (!ch->signaled_) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(ch->fd_, &one, sizeof one);
    ch->signaled_ = true;
  }
}

namespace {
// Makes the channel's fd unreadable once its queue is empty.
void reset_if_empty(int fd, bool& signaled, bool empty) {
  if (signaled && empty) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);  // never blocks: the count is 1
    signaled = false;
  }
}
}  // namespace

Result<Event> Service::get_event(Channel* ch, bool nonblocking) {
  for (;;) {
    {
      std::lock_guard g(mu_);
      if (!ch->queue_.empty()) {
        Event ev = ch->queue_.front();
        ch->queue_.pop_front();
        reset_if_empty(ch->fd_, ch->signaled_, ch->queue_.empty());
        ev.counted->delivered_++;
        if (ev.out.type == CmEventType::kConnectRequest) ev.counted->pending_requests_--;
        return ev;
      }
    }
    if (nonblocking) return fail(std::errc::resource_unavailable_try_again);
    pollfd p{ch->fd_, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return fail(static_cast<std::errc>(errno));
  }
}

void Service::ack_event(CmId* counted) {
  std::lock_guard g(mu_);
  counted->acked_++;
  if (counted->free_when_acked_ && counted->acked_ >= counted->delivered_) {
    delete counted;
    return;
  }
  acked_cv_.notify_all();
}

bool Service::has_queued_event(CmId* id) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return false;
  return std::any_of(id->channel_->queue_.begin(), id->channel_->queue_.end(),
                     [id](const Event& e) { return e.id == id || e.counted == id; });
}

void Service::drop_events_locked(CmId* id, std::vector<CmId*>& orphans) {
  Channel* ch = id->channel_;
  std::erase_if(ch->queue_, [&](const Event& e) {
    if (e.id != id && e.counted != id) return false;
    if (e.out.type == CmEventType::kConnectRequest && e.counted == id && e.id != id) {
      orphans.push_back(e.id);
      id->pending_requests_--;
    }
    return true;
  });
  reset_if_empty(ch->fd_, ch->signaled_, ch->queue_.empty());
}

Result<void> Service::migrate_id(CmId* id, Channel* to) {
  std::unique_lock lk(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  Channel* from = id->channel_;
  if (from == to) return {};
  std::deque<Event> moved;
  std::erase_if(from->queue_, [&](const Event& e) {
    if (e.id != id && e.counted != id) return false;
    moved.push_back(e);
    return true;
  });
  reset_if_empty(from->fd_, from->signaled_, from->queue_.empty());
  for (auto& e : moved) {
    if (e.id != id && e.id != nullptr) e.id->channel_ = to;  // an undelivered child follows its listener
    push_event_locked(to, e);
  }
  acked_cv_.wait(lk, [id] { return id->acked_ >= id->delivered_; });
  id->channel_ = to;
  return {};
}

void Service::close_channel(Channel* ch) {
  std::vector<Outgoing> out;
  {
    std::unique_lock lk(mu_);
    std::vector<CmId*> on_channel;
    for (auto& [comm, id] : ids_)
      if (id->channel_ == ch && !id->destroying_) on_channel.push_back(id);
    // Requests not handed out yet have no application handle: free them.
    std::vector<CmId*> undelivered;
    for (const Event& e : ch->queue_)
      if (e.out.type == CmEventType::kConnectRequest && e.id != e.counted) undelivered.push_back(e.id);
    for (CmId* id : on_channel) {
      if (std::find(undelivered.begin(), undelivered.end(), id) != undelivered.end()) continue;
      tear_down_locked(id, out);
      forget_locked(id);
      id->channel_ = nullptr;
      id->orphaned_ = true;
      id->pending_requests_ = 0;
    }
    ch->queue_.clear();
    reset_if_empty(ch->fd_, ch->signaled_, true);
    for (CmId* child : undelivered) {
      tear_down_locked(child, out);
      forget_locked(child);
      delete child;
    }
  }
  send_all(std::move(out));
}

}  // namespace softhca::cm
