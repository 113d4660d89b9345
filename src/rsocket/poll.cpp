// rpoll and rselect over any mix of rsockets and ordinary descriptors.
//
// An rsocket is ready when its own state says so (data queued, send space,
// a connection waiting), which only progress on its CQ and CM channel can
// change. So: make progress on every rsocket and poll the ordinary fds
// without waiting; if nothing is ready, arm every rsocket's CQ and check
// once more (a completion before the arm raises no event), then sleep in
// poll(2) on the ordinary fds plus each rsocket's CM event channel and
// completion channel. Idle, it sleeps; it never spins.
#include <time.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "rsocket/api.hpp"
#include "rsocket/socket_table.hpp"

namespace softhca::rsocket {

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// One pass without sleeping: sets revents, returns how many are ready.
int check_all(pollfd* fds, nfds_t nfds, const std::vector<std::shared_ptr<Socket>>& sockets) {
  std::vector<pollfd> plain;
  std::vector<nfds_t> plain_index;
  int ready = 0;
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    if (sockets[i]) {
      fds[i].revents = sockets[i]->poll_events(fds[i].events);
    } else if (fds[i].fd >= 0) {
      plain.push_back(fds[i]);
      plain_index.push_back(i);
    }
  }
  if (!plain.empty() && ::poll(plain.data(), plain.size(), 0) > 0) {
    for (size_t j = 0; j < plain.size(); ++j) fds[plain_index[j]].revents = plain[j].revents;
  }
  for (nfds_t i = 0; i < nfds; ++i)
    if (fds[i].revents != 0) ++ready;
  return ready;
}

}  // namespace

Result<int> poll(pollfd* fds, nfds_t nfds, int timeout_ms) {
  if (fds == nullptr && nfds != 0) return fail(std::errc::bad_address);
  std::vector<std::shared_ptr<Socket>> sockets(nfds);
  bool any_rsocket = false;
  for (nfds_t i = 0; i < nfds; ++i) {
    if (fds[i].fd >= 0) sockets[i] = find_socket(fds[i].fd);
    any_rsocket = any_rsocket || sockets[i] != nullptr;
  }
  if (!any_rsocket) {
    const int n = ::poll(fds, nfds, timeout_ms);
    if (n < 0) return fail(static_cast<std::errc>(errno));
    return n;
  }
  // The deadline in nanoseconds and each sleep rounded up: a deadline in
  // whole milliseconds let rpoll(..., 1) give up after a few microseconds
  // whenever the clock crossed a millisecond before the sleep (udpong then
  // resends, and every early timeout left one more duplicate echo in flight
  // for the rest of the run). poll(2) never returns before its timeout;
  // neither do we.
  const int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ns() + int64_t{timeout_ms} * 1'000'000;
  std::vector<pollfd> wait;
  std::vector<std::pair<nfds_t, size_t>> rsocket_slots;  // fds index, first wait slot
  for (;;) {
    const int ready = check_all(fds, nfds, sockets);
    if (ready != 0 || timeout_ms == 0) return ready;
    bool armed_now = false;
    for (auto& s : sockets)
      if (s && s->arm()) armed_now = true;
    if (armed_now) continue;  // look again now that completions will wake us

    wait.clear();
    rsocket_slots.clear();
    for (nfds_t i = 0; i < nfds; ++i) {
      if (sockets[i]) {
        pollfd pair[2];
        const int n = sockets[i]->wait_fds(pair);
        rsocket_slots.emplace_back(i, wait.size());
        wait.insert(wait.end(), pair, pair + n);
        if (n == 1) wait.push_back(pollfd{-1, 0, 0});
      } else {
        wait.push_back(pollfd{fds[i].fd, fds[i].events, 0});
      }
    }
    int sleep_ms = -1;
    if (deadline != INT64_MAX) {
      const int64_t left = deadline - now_ns();
      if (left <= 0) return 0;
      sleep_ms = static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000, INT_MAX));
    }
    const int n = ::poll(wait.data(), wait.size(), sleep_ms);
    if (n < 0) return fail(static_cast<std::errc>(errno));
    for (auto [index, slot] : rsocket_slots)
      if (wait[slot].revents != 0 || wait[slot + 1].revents != 0) sockets[index]->consume_wakeups();
    if (n == 0 && deadline != INT64_MAX && now_ns() >= deadline) return check_all(fds, nfds, sockets);
  }
}

Result<int> select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return fail(std::errc::invalid_argument);
  std::vector<pollfd> fds;
  for (int fd = 0; fd < nfds; ++fd) {
    short events = 0;
    if (readfds != nullptr && FD_ISSET(fd, readfds)) events |= POLLIN;
    if (writefds != nullptr && FD_ISSET(fd, writefds)) events |= POLLOUT;
    if (exceptfds != nullptr && FD_ISSET(fd, exceptfds)) events |= POLLPRI;
    if (events != 0) fds.push_back(pollfd{fd, events, 0});
  }
  int timeout_ms = -1;
  if (timeout != nullptr) {
    if (timeout->tv_sec < 0 || timeout->tv_usec < 0) return fail(std::errc::invalid_argument);
    timeout_ms = static_cast<int>(std::min<int64_t>(int64_t{timeout->tv_sec} * 1000 + (timeout->tv_usec + 999) / 1000,
                                                    INT_MAX));
  }
  auto polled = rsocket::poll(fds.data(), fds.size(), timeout_ms);
  if (!polled) return fail(polled.error());
  if (readfds != nullptr) FD_ZERO(readfds);
  if (writefds != nullptr) FD_ZERO(writefds);
  if (exceptfds != nullptr) FD_ZERO(exceptfds);
  int count = 0;
  for (const pollfd& p : fds) {
    if (readfds != nullptr && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0 && (p.events & POLLIN) != 0) {
      FD_SET(p.fd, readfds);
      ++count;
    }
    if (writefds != nullptr && (p.revents & (POLLOUT | POLLERR)) != 0 && (p.events & POLLOUT) != 0) {
      FD_SET(p.fd, writefds);
      ++count;
    }
    if (exceptfds != nullptr && (p.revents & POLLPRI) != 0) {
      FD_SET(p.fd, exceptfds);
      ++count;
    }
  }
  if (timeout != nullptr && count == 0) *timeout = timeval{0, 0};
  return count;
}

}  // namespace softhca::rsocket
