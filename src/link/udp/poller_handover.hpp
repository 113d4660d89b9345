// When the udp link's thread leaves the sockets to the application.
//
// An application thread that busy-polls its CQ receives the link's packets
// itself (Link::poll, when the CQ is empty). The link's thread sleeps in
// ppoll on the same sockets, so the kernel still wakes it for each burst:
// on a host with few cores the woken thread takes a core from a peer (the
// other end of the connection on the same machine, or the next process)
// only to find that the poller already took the packets. Once application
// threads have polled for a while (`sustain`), the link's thread hands the
// sockets over: it stops watching them and wakes only for its timers, its
// hand-offs and a look every kLookEveryNs. It takes them back
// - at once when a poller goes to sleep (arms a CQ for an event);
// - at a look that finds no poll for kPauseNs. Then it asks how much the
//   last poller ran meanwhile: a poller that ran without polling waits some
//   other way (a ping-pong that spins on the memory its peer writes, after
//   polling for its own send completion), and had packets waited for it,
//   they waited up to kLookEveryNs: no handing over for a while then
//   (kFirstBackoffNs, doubling at each such look up to kMaxBackoffNs), so
//   that such an application pays a millisecond now and then, not at every
//   message. Such a look long after the last one (kForgetAfterBackoffs of
//   the pause it would start) starts a short pause again: a ping-pong whose
//   replies come with their ACKs (AckPiggyback) waits that way only when
//   an ACK once came alone, and it lost the sockets for a tenth of a
//   second at the first time, and for longer at each. A poller that did not run (preempted, or asleep) costs nothing
//   of that kind: the link's thread takes what waits and hands the sockets
//   over again at the next poll.
// Pure: `now` and the poller's CPU time come in. Any thread may call
// polled() and resting(); the rest is the link thread's.
#pragma once

#include <atomic>
#include <cstdint>

namespace softhca::udp {

class PollerHandover {
 public:
  // No poll for this long at a look: the pollers paused.
  static constexpr uint64_t kPauseNs = 200'000;
  // No poll for this long: the next one starts a new stretch of polling.
  static constexpr uint64_t kStretchGapNs = 10'000'000;
  // How often the link thread looks while it has handed the sockets over.
  static constexpr uint64_t kLookEveryNs = 1'000'000;
  static constexpr uint64_t kFirstBackoffNs = 4'000'000;
  static constexpr uint64_t kForgetAfterBackoffs = 64;
  static constexpr uint64_t kMaxBackoffNs = 60'000'000'000;

  // `sustain_ns`: how long pollers must have polled before the sockets are
  // handed over; 0: never.
  explicit PollerHandover(uint64_t sustain_ns) : sustain_ns_(sustain_ns) {}

  // An application thread (`tid`) found its CQ empty and is done looking
  // at the sockets.
  void polled(uint64_t now_ns, int tid) {
    const uint64_t last = last_poll_ns_.load(std::memory_order_relaxed);
    if (last == 0 || now_ns < last || now_ns - last > kStretchGapNs)
      busy_since_ns_.store(now_ns, std::memory_order_relaxed);
    last_poll_ns_.store(now_ns, std::memory_order_relaxed);
    poller_tid_.store(tid, std::memory_order_relaxed);
  }
  // What it received may take it a while (a NAK's go-back-N sends a
  // window): it is polling until it is done (then polled() again).
  void receiving(bool inside) { inside_.fetch_add(inside ? 1 : -1, std::memory_order_relaxed); }

  // An application thread is about to sleep until an event: the polling is
  // over (the next poll starts a new stretch).
  void resting() { last_poll_ns_.store(0, std::memory_order_seq_cst); }

  enum class Look {
    kKeep,     // the link thread watches the sockets itself
    kPolling,  // the pollers have them
    kPaused,   // they had them and paused: ask paused()
  };
  // The link thread, at each wake. seq_cst, as resting()'s store: the link
  // thread flags that it handed the sockets over, then looks again
  // (UdpLink::loop), so a poller going to rest meanwhile is seen.
  Look look(uint64_t now_ns) const {
    if (sustain_ns_ == 0 || now_ns < not_before_ns_) return Look::kKeep;
    const uint64_t last = last_poll_ns_.load(std::memory_order_seq_cst);
    if (last == 0) return Look::kKeep;
    const uint64_t since = busy_since_ns_.load(std::memory_order_relaxed);
    if (since > last || last - since < sustain_ns_) return Look::kKeep;
    // (A poll after `now_ns` was read is a poll just now.)
    const uint64_t quiet = now_ns > last ? now_ns - last : 0;
    return quiet <= kPauseNs || inside_.load(std::memory_order_relaxed) > 0 ? Look::kPolling : Look::kPaused;
  }
  int poller() const { return poller_tid_.load(std::memory_order_relaxed); }

  // The link thread handed the sockets over at `now_ns`, or still has them
  // handed over: `poller_cpu_ns` is the poller's CPU time then (0: unknown).
  void sample(uint64_t now_ns, uint64_t poller_cpu_ns) {
    sampled_at_ns_ = now_ns;
    sampled_cpu_ns_ = poller_cpu_ns;
  }
  // The pollers paused (look() said kPaused) while the sockets were theirs:
  // the link thread takes them back. `poller_cpu_ns` as in sample();
  // `packets_waiting`: whether the sockets held packets. Returns how long
  // handing over now pauses (0: it does not).
  uint64_t paused(uint64_t now_ns, uint64_t poller_cpu_ns, bool packets_waiting) {
    // What it ran after its last poll: its CPU time since the sample, less
    // the time from the sample to that poll (it ran through that, polling).
    const uint64_t last = last_poll_ns_.load(std::memory_order_relaxed);
    const uint64_t from = last > sampled_at_ns_ ? last : sampled_at_ns_;
    bool ran = false;
    if (poller_cpu_ns != 0 && sampled_cpu_ns_ != 0 && poller_cpu_ns >= sampled_cpu_ns_ && now_ns > from) {
      const uint64_t cpu = poller_cpu_ns - sampled_cpu_ns_;
      const uint64_t polling = from - sampled_at_ns_;
      ran = cpu > polling && cpu - polling >= (now_ns - from) / 2;
    }
    sampled_cpu_ns_ = 0;
    if (!packets_waiting || !ran) return 0;
    if (last_backoff_ns_ != 0 && now_ns - last_backoff_ns_ > kForgetAfterBackoffs * backoff_ns_)
      backoff_ns_ = kFirstBackoffNs;
    last_backoff_ns_ = now_ns;
    const uint64_t backoff = backoff_ns_;
    not_before_ns_ = now_ns + backoff;
    backoff_ns_ = backoff >= kMaxBackoffNs / 2 ? kMaxBackoffNs : backoff * 2;
    return backoff;
  }

 private:
  const uint64_t sustain_ns_;
  std::atomic<uint64_t> last_poll_ns_{0};   // the latest empty poll; 0: none since the last rest
  std::atomic<uint64_t> busy_since_ns_{0};  // when the current stretch of polling began
  std::atomic<int> poller_tid_{0};          // who polled last
  std::atomic<int> inside_{0};              // pollers handling what they received
  // The link thread's.
  uint64_t not_before_ns_ = 0;  // no handing over before this
  uint64_t backoff_ns_ = kFirstBackoffNs;  // the next pause's length
  uint64_t last_backoff_ns_ = 0;           // when the last pause began (0: none yet)
  uint64_t sampled_at_ns_ = 0;
  uint64_t sampled_cpu_ns_ = 0;
};

}  // namespace softhca::udp
