// transport_flows_fuzz.cpp's account of the requester: every message posted,
// the PSNs it takes, which of its packets went out, its local buffer between
// guard bytes, and the checks on what the requester does with them:
// completions name posted messages, in posting order, each once; a message
// completes successfully only once each of its packets went out; a request
// packet carries a PSN of a message still outstanding and within the window
// of unacknowledged PSNs; no more READs and atomics than max_rd_atomic are
// out at once; the window accounting matches has_room(); no byte lands
// outside a local buffer.
#pragma once

#include <algorithm>
#include <deque>
#include <vector>

#include "checked_port.hpp"
#include "transport/psn.hpp"
#include "transport/requester_flow.hpp"

namespace softhca::fuzz {

// requester_flow.cpp's window: messages, and PSNs past the oldest unacknowledged one.
inline constexpr std::size_t kWindowMessages = 128;
inline constexpr uint32_t kWindowPackets = 128;

class RequesterLedger {
 public:
  static constexpr std::size_t kGuard = 16;
  static constexpr uint8_t kPattern = 0x5A;

  struct Posted {
    uint32_t position = 0;
    transport::Operation op = transport::Operation::kSend;
    uint32_t first_psn = 0;
    uint32_t npsn = 0;
    std::vector<bool> sent;      // per packet (SEND, WRITE); [0]: the request (READ, atomics)
    std::vector<uint8_t> local;  // guard, the message's bytes, guard
    uint8_t* data() { return local.data() + kGuard; }
  };

  RequesterLedger(bool reliable, uint32_t mtu, uint32_t start_psn, uint32_t max_rd_atomic)
      : reliable_(reliable),
        mtu_(mtu),
        next_psn_(start_psn & transport::kPsnMask),
        rd_atomic_limit_(std::max<uint32_t>(1, max_rd_atomic)) {}

  // A message about to be posted: its local buffer (filled with `fill`).
  Posted& add(uint32_t position, transport::Operation op, uint64_t length, uint8_t fill) {
    Posted p;
    p.position = position;
    p.op = op;
    p.first_psn = next_psn_;
    p.npsn = transport::is_atomic(op) ? 1 : transport::packets_for(length, mtu_);
    const bool one_request = op == transport::Operation::kRead || transport::is_atomic(op);
    p.sent.assign(one_request ? 1 : p.npsn, false);
    p.local.assign(kGuard + length + kGuard, kPattern);
    for (uint64_t i = 0; i < length; ++i) p.data()[i] = static_cast<uint8_t>(fill + i * 13);
    next_psn_ = transport::psn_add(next_psn_, p.npsn);
    posted_.push_back(std::move(p));
    return posted_.back();
  }

  uint32_t next_psn() const { return next_psn_; }
  bool empty() const { return posted_.empty(); }
  const Posted& oldest() const { return posted_.front(); }

  // The requester's window is full by its accounting.
  // `window`: the requester's max_window() (kWindowPackets, or more
  // towards a responder that keeps packets past a gap).
  bool full(uint32_t window) const {
    if (!reliable_) return false;
    uint64_t packets = 0;
    for (const Posted& p : posted_) packets += p.npsn;
    return posted_.size() >= kWindowMessages || packets >= window;
  }

  // One request packet the requester sent.
  void sent(const wire::Headers& h, bool failed) {
    if (failed) broken("a requester whose flow failed or was aborted sends nothing");
    const uint32_t psn = h.bth.psn;
    for (Posted& p : posted_) {
      const int32_t at = transport::psn_diff(psn, p.first_psn);
      if (at < 0 || at >= static_cast<int32_t>(p.npsn)) continue;
      p.sent[p.sent.size() == 1 ? 0 : static_cast<std::size_t>(at)] = true;
      step_psns_.push_back(psn);
      return;
    }
    broken("a request packet carries a PSN of a message still outstanding");
  }

  // At the start of a step: what the window is measured against afterwards.
  void step_begins() { step_psns_.clear(); }

  // At the end of a step, after its completions were popped: the requester
  // sends only within `window` of the oldest unacknowledged PSN, which
  // is at most the end of the oldest message still outstanding.
  void step_ends(uint32_t window) {
    if (!reliable_) return;
    // Every READ or atomic sent and not completed the responder may have
    // run, and it keeps only max_dest_rd_atomic of them to answer again: no
    // more than max_rd_atomic may be out at once. (Checked here, once the
    // step's completions are in: one completes and the next goes out in the
    // same call.)
    const auto out = std::count_if(posted_.begin(), posted_.end(),
                                   [](const Posted& q) { return waits_for_answer(q.op) && q.sent[0]; });
    if (static_cast<uint32_t>(out) > rd_atomic_limit_) broken("no more READs and atomics in flight than max_rd_atomic");
    const uint32_t bound = posted_.empty() ? next_psn_ : transport::psn_add(oldest().first_psn, oldest().npsn);
    for (uint32_t psn : step_psns_) {
      if (transport::psn_diff(psn, bound) >= static_cast<int32_t>(window))
        broken("the requester sends only within its window");
    }
  }

  void completed(const transport::RequesterCompletion& c, bool failed) {
    if (posted_.empty() || posted_.front().position != c.position)
      broken("completions name posted messages, in posting order, each once");
    Posted& p = posted_.front();
    if (c.status == IBV_WC_SUCCESS) {
      if (!std::all_of(p.sent.begin(), p.sent.end(), [](bool b) { return b; }))
        broken("a message completes successfully only after each of its packets went out");
    } else if (!failed) {
      broken("a completion in error ends the flow");
    }
    check_guards(p);
    posted_.pop_front();  // its buffer goes: the requester must not touch it after completion
  }

  // The QP is torn down: what is outstanding is flushed, never completed.
  void aborted() { posted_.clear(); }

  void check_guards() {
    for (Posted& p : posted_) check_guards(p);
  }

 private:
  // READ, CMP_AND_SWP, FETCH_AND_ADD: answered by a response the responder
  // must be able to replay (an ATOMIC_WRITE is acknowledged like a WRITE).
  static bool waits_for_answer(transport::Operation op) {
    return op == transport::Operation::kRead || op == transport::Operation::kCompareSwap ||
           op == transport::Operation::kFetchAdd;
  }

  static void check_guards(const Posted& p) {
    const std::size_t n = p.local.size();
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (p.local[i] != kPattern || p.local[n - 1 - i] != kPattern) broken("no byte lands outside a local buffer");
    }
  }

  bool reliable_;
  uint32_t mtu_;
  uint32_t next_psn_;
  std::deque<Posted> posted_;
  std::vector<uint32_t> step_psns_;
  uint32_t rd_atomic_limit_;
};

}  // namespace softhca::fuzz
