#include "lossy_path.hpp"

#include "encoded_packet.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace softhca::transport {
namespace {

constexpr uint32_t kRequesterQpn = 0x100;
constexpr uint32_t kResponderQpn = 0x200;
constexpr uint32_t kStartPsn = 0xfff000;  // wraps during a long run

const wire::UdpFlow kFlow{wire::Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1},
                          wire::Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2}};

}  // namespace

std::string LossyPathResult::summary() const {
  char line[512];
  std::snprintf(line, sizeof line,
                "%.2f ms (link idle %.2f ms), %llu requests (%llu again), lost %llu requests %llu responses, "
                "%llu naks, %llu probes, %llu timeouts, mean window %.1f; stalls: %llu ended by a probe (%.2f ms), "
                "%llu by a timeout (%.2f ms), %llu by a response (%.2f ms)",
                double(elapsed_ns) / 1e6, double(idle_ns) / 1e6, (unsigned long long)data_packets,
                (unsigned long long)retransmitted, (unsigned long long)lost_requests,
                (unsigned long long)lost_responses, (unsigned long long)seq_naks, (unsigned long long)probes,
                (unsigned long long)timeouts, mean_window(), (unsigned long long)stalls_by_probe,
                double(stall_ns_by_probe) / 1e6, (unsigned long long)stalls_by_timeout,
                double(stall_ns_by_timeout) / 1e6, (unsigned long long)stalls_by_response,
                double(stall_ns_by_response) / 1e6);
  return line;
}

void LossyPath::Link::send(const wire::Headers& h, const iovec* payload, int npayload, uint32_t length) {
  auto encoded = test_support::encode_packet(kFlow, h, payload, npayload, length);
  if (!encoded) return;
  std::vector<uint8_t> image = std::move(encoded->image);
  std::vector<uint8_t> bytes = std::move(encoded->bytes);
  const size_t size = bytes.size();
  LossyPath& p = path_;
  if (requests_) {
    ++p.result_.data_packets;
    p.result_.window_sum += p.requester_->window_packets();
    ++p.result_.window_samples;
    // A stall: the link idle for a while though messages wait. What ran
    // just now (the caller of this send) ended it.
    if (p.now_ > free_at_ns) {
      p.result_.idle_ns += p.now_ - free_at_ns;
      if (p.now_ - free_at_ns > p.stall_ns_) p.stall_ns_pending_ = p.now_ - free_at_ns;
    }
  }
  // It leaves once the link is free and it is serialised, then takes the delay.
  const uint64_t leaves = std::max(p.now_, free_at_ns) + (size + image.size()) * p.c_.ns_per_kib / 1024;
  free_at_ns = leaves;
  if (p.lose()) {
    ++(requests_ ? p.result_.lost_requests : p.result_.lost_responses);
    return;
  }
  queue.push_back(InFlight{leaves + p.c_.delay_ns, std::move(image), std::move(bytes)});
}

void LossyPath::stall_ended(Waking by) {
  const uint64_t ns = stall_ns_pending_;
  if (ns == 0) return;
  stall_ns_pending_ = 0;
  switch (by) {
    case Waking::kProbe:
      ++result_.stalls_by_probe;
      result_.stall_ns_by_probe += ns;
      break;
    case Waking::kTimeout:
      ++result_.stalls_by_timeout;
      result_.stall_ns_by_timeout += ns;
      break;
    case Waking::kResponse:
      ++result_.stalls_by_response;
      result_.stall_ns_by_response += ns;
      break;
  }
}

void LossyPath::post_what_fits() {
  while (posted_ < c_.messages && posted_ - completed_ < c_.queue_depth && requester_->has_room()) {
    OutgoingMessage m;
    m.position = posted_;
    m.op = Operation::kWrite;
    m.remote_addr = kIova;
    m.rkey = kKey;
    m.local[0] = iovec{payload_.data(), payload_.size()};
    m.nlocal = 1;
    m.length = payload_.size();
    requester_->post(m, now_, to_responder_);
    ++posted_;
  }
}

void LossyPath::deliver(Link& link, bool to_responder) {
  InFlight p = std::move(link.queue.front());
  link.queue.pop_front();
  const auto parsed = wire::parse(p.image, p.bytes);
  ASSERT_TRUE(parsed.has_value());
  if (to_responder) {
    responder_->on_request(*parsed, port_, to_requester_);
  } else {
    requester_->on_response(*parsed, now_, to_responder_);
  }
}

LossyPathResult LossyPath::run(uint64_t stall_ns) {
  stall_ns_ = stall_ns;
  RequesterConfig rc;
  rc.dest_qpn = kResponderQpn;
  rc.mtu = c_.mtu;
  rc.start_psn = kStartPsn;
  rc.timeout = c_.timeout;
  rc.selective = c_.selective;
  rc.counters = CounterSink(requester_counters_.get(), nullptr);
  requester_.emplace(rc);
  ResponderConfig sc;
  sc.peer_qpn = kRequesterQpn;
  sc.mtu = c_.mtu;
  sc.start_psn = kStartPsn;
  sc.selective = c_.selective;
  sc.counters = CounterSink(responder_counters_.get(), nullptr);
  responder_.emplace(sc);
  payload_.assign(c_.message_bytes, 0x5A);

  post_what_fits();
  // Each step takes the earliest event: a packet arriving either way, or the
  // requester's timer.
  for (uint64_t steps = 0; completed_ < c_.messages && !requester_->failed() && steps < 100'000'000; ++steps) {
    uint64_t next = UINT64_MAX;
    int which = -1;
    if (!to_responder_.queue.empty()) next = to_responder_.queue.front().due_ns, which = 0;
    if (!to_requester_.queue.empty() && to_requester_.queue.front().due_ns < next)
      next = to_requester_.queue.front().due_ns, which = 1;
    const uint64_t d = requester_->deadline();
    if (d != 0 && d < next) next = d, which = 2;
    if (which < 0) break;
    now_ = std::max(now_, next);
    Waking by = Waking::kResponse;
    if (which == 0) {
      deliver(to_responder_, true);
    } else if (which == 1) {
      deliver(to_requester_, false);
    } else {
      // Which of the two fired shows in the counter the ACK timeout bumps.
      const uint64_t timeouts_before = requester_counters_->get(Counter::kCompleterRetryErr);
      const uint64_t retransmitted_before = requester_counters_->get(Counter::kRetransmittedPkts);
      requester_->on_timer(now_, to_responder_);
      if (requester_counters_->get(Counter::kCompleterRetryErr) != timeouts_before) {
        ++result_.timeouts;
        by = Waking::kTimeout;
      } else {
        if (requester_counters_->get(Counter::kRetransmittedPkts) != retransmitted_before) ++result_.probes;
        by = Waking::kProbe;
      }
    }
    RequesterCompletion c;
    while (requester_->pop_completion(c)) {
      EXPECT_EQ(c.status, IBV_WC_SUCCESS);
      ++completed_;
    }
    post_what_fits();  // completions make room at once, as the engine posts from its answers
    stall_ended(by);
  }
  result_.finished = completed_ == c_.messages;
  result_.elapsed_ns = now_;
  result_.retransmitted = requester_counters_->get(Counter::kRetransmittedPkts);
  result_.seq_naks = responder_counters_->get(Counter::kSentSeqNak);
  return result_;
}

}  // namespace softhca::transport
