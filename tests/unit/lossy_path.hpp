// A simulated path for the packet-level transport's throughput under loss:
// a RequesterFlow and a ResponderFlow joined by two one-way links, each with
// a fixed delay, a serialisation time per byte (a packet leaves only once the
// one before it has) and a seeded loss, on a virtual clock, driven by an
// application that keeps the send queue as full as ib_write_bw does. It
// measures how long a run of WRITEs takes and what the requester waited on:
// the wall clock of the hosts ib_write_bw runs on is too noisy for that.
#pragma once

#include <arpa/inet.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fake_responder_port.hpp"
#include "transport/requester_flow.hpp"
#include "transport/responder_flow.hpp"
#include "wire/ip_udp.hpp"

namespace softhca::transport {

struct LossyPathConfig {
  uint64_t delay_ns = 30'000;       // one way
  uint64_t ns_per_kib = 1'000;      // serialisation: 1 us per 1 KiB packet
  uint32_t loss_per_10000 = 100;    // each way, each packet
  uint64_t seed = 3;
  uint32_t mtu = 1024;
  uint32_t message_bytes = 64 * 1024;
  uint32_t messages = 1024;         // 64 MiB
  uint32_t queue_depth = 128;       // WRITEs the application keeps posted
  uint8_t timeout = 14;             // perftest's: 67 ms
  bool selective = false;           // both ends recover selectively (transport/selective.hpp)
};

// What one run did. A stall is a stretch longer than `stall_ns` in which the
// requester sent nothing while it had messages to send; it is named for what
// ended it.
struct LossyPathResult {
  bool finished = false;
  uint64_t elapsed_ns = 0;
  uint64_t idle_ns = 0;           // the requests' link idle (before the last request sent)
  uint64_t data_packets = 0;      // requests sent (first times and again)
  uint64_t lost_requests = 0;
  uint64_t lost_responses = 0;
  uint64_t retransmitted = 0;
  uint64_t seq_naks = 0;          // sequence NAKs the responder sent
  uint64_t probes = 0;            // tail-loss probes fired
  uint64_t timeouts = 0;          // ACK timeouts fired
  uint64_t stalls_by_probe = 0, stall_ns_by_probe = 0;
  uint64_t stalls_by_timeout = 0, stall_ns_by_timeout = 0;
  uint64_t stalls_by_response = 0, stall_ns_by_response = 0;
  uint64_t window_sum = 0, window_samples = 0;  // the window, sampled at each packet sent
  double mean_window() const { return window_samples ? double(window_sum) / double(window_samples) : 0; }
  double goodput_gbps(uint64_t bytes) const { return elapsed_ns ? 8.0 * double(bytes) / double(elapsed_ns) : 0; }
  std::string summary() const;
};

class LossyPath {
 public:
  explicit LossyPath(const LossyPathConfig& c) : c_(c), port_(c.message_bytes), rng_(c.seed) {}

  LossyPathResult run(uint64_t stall_ns = 200'000);

 private:
  struct InFlight {
    uint64_t due_ns;
    std::vector<uint8_t> image, bytes;
  };
  // One direction: a FIFO whose packets arrive in the order they left.
  class Link final : public PacketSink {
   public:
    Link(LossyPath& path, bool requests) : path_(path), requests_(requests) {}
    void send(const wire::Headers& h, const iovec* payload, int npayload, uint32_t length) override;
    std::deque<InFlight> queue;
    uint64_t free_at_ns = 0;

   private:
    LossyPath& path_;
    bool requests_;
  };

  enum class Waking { kResponse, kProbe, kTimeout };
  bool lose() { return rng_() % 10000 < c_.loss_per_10000; }
  // A stall that the packet just sent ended is counted for what sent it.
  void stall_ended(Waking by);
  void post_what_fits();
  void deliver(Link& link, bool to_responder);

  LossyPathConfig c_;
  FakePort port_;
  std::mt19937_64 rng_;
  std::unique_ptr<Counters> requester_counters_ = std::make_unique<Counters>();
  std::unique_ptr<Counters> responder_counters_ = std::make_unique<Counters>();
  std::optional<RequesterFlow> requester_;
  std::optional<ResponderFlow> responder_;
  Link to_responder_{*this, true}, to_requester_{*this, false};
  std::vector<uint8_t> payload_;
  uint32_t posted_ = 0, completed_ = 0;
  uint64_t now_ = 0;
  uint64_t stall_ns_ = 0;
  uint64_t stall_ns_pending_ = 0;
  LossyPathResult result_;
};

}  // namespace softhca::transport
