// When a responder's ACKs wait for the next request to leave with them.
//
// A ping-pong (ib_write_lat, ib_send_lat, an RPC) answers each message it
// receives with one of its own a few microseconds later. Sent at once, the
// ACK of the message costs the responder a system call of its own and the
// peer a receive of its own; and it tends to arrive first, so that the
// peer's application, its send now complete, goes on to wait for the reply
// in a way that receives nothing (ib_write_lat spins on the memory the
// reply writes): then only the peer's link thread, woken, takes the reply
// in, a context switch on every message. Held until the reply leaves, the
// ACK goes in the same sendmmsg, behind the reply: the peer, polling for the
// ACK, has handled the reply by the time it has the ACK.
//
// Held only while holding pays: from a request that left soon after ACKs
// had gone alone (kOpportunityNs), until held ACKs had to leave alone. Held
// ACKs are due kHoldNs after they were made, whoever then sees them (a
// thread polling its CQ, the link's thread), so that a peer's tail probe
// (200 us at the soonest) never fires for an ACK that is only held. Real
// NICs coalesce ACKs the same way: IBTA lets a responder acknowledge late,
// within the requester's ACK timeout.
//
// Pure: times come in. Any thread may call it.
#pragma once

#include <atomic>
#include <cstdint>

namespace softhca::udp {

class AckPiggyback {
 public:
  // A request this soon after ACKs left alone could have carried them.
  static constexpr uint64_t kOpportunityNs = 50'000;
  // How long held ACKs may wait for a request.
  static constexpr uint64_t kHoldNs = 60'000;

  // Whether ACKs made now wait for a request.
  bool holding() const { return holding_.load(std::memory_order_relaxed); }

  // ACKs left alone at `now_ns`: made while not holding, or released.
  void sent_alone(uint64_t now_ns) { last_alone_ns_.store(now_ns, std::memory_order_relaxed); }

  // Requests leave at `now_ns`. `carried`: held ACKs went with them.
  void request_leaves(uint64_t now_ns, bool carried) {
    if (carried) {
      last_alone_ns_.store(0, std::memory_order_relaxed);
      return;
    }
    const uint64_t alone = last_alone_ns_.load(std::memory_order_relaxed);
    if (alone != 0 && now_ns >= alone && now_ns - alone <= kOpportunityNs) {
      holding_.store(true, std::memory_order_relaxed);
      last_alone_ns_.store(0, std::memory_order_relaxed);
    }
  }

  // Held ACKs made at `held_ns` had no request to go with by `now_ns`:
  // they leave alone, and ACKs made from now on leave at once.
  void released_alone(uint64_t now_ns) {
    holding_.store(false, std::memory_order_relaxed);
    sent_alone(now_ns);
  }

  static bool due(uint64_t held_ns, uint64_t now_ns) { return now_ns >= held_ns + kHoldNs; }

 private:
  std::atomic<bool> holding_{false};
  std::atomic<uint64_t> last_alone_ns_{0};  // ACKs that left alone lately (0: none since a request)
};

}  // namespace softhca::udp
