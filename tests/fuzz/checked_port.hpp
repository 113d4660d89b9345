// The responder's side of transport_flows_fuzz.cpp: the unit tests' FakePort
// (its memory, keys and receive queue) behind checks of what the responder
// asks of it. Only the middle of the fake memory is registered; the rest is
// filled with a pattern, so that a write outside the registered range is
// caught twice: at the port (it must be inside the key, and the key must
// still be registered) and afterwards (the pattern must be intact). Each
// atomic records the PSN of the request being handled: the same PSN twice
// means a retransmitted atomic ran again.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <set>

#include "fake_responder_port.hpp"

namespace softhca::fuzz {

[[noreturn]] inline void broken(const char* promise) {
  std::fprintf(stderr, "transport_flows_fuzz: broken promise: %s\n", promise);
  std::abort();
}

class CheckedPort final : public transport::ResponderPort {
 public:
  static constexpr std::size_t kGuard = 4096;       // pattern bytes on each side
  static constexpr std::size_t kRegistered = 8192;  // what the keys cover
  static constexpr uint8_t kPattern = 0xA5;

  CheckedPort() : fake_(kGuard + kRegistered + kGuard) {
    std::fill(fake_.memory.begin(), fake_.memory.end(), kPattern);
    std::fill(registered_begin(), registered_begin() + kRegistered, uint8_t{0});
    for (auto& [key, mr] : fake_.keys) {
      mr.length = kRegistered;
      mr.host_addr = reinterpret_cast<uint64_t>(registered_begin());
    }
    all_keys_ = fake_.keys;
  }

  transport::FakePort& fake() { return fake_; }
  // The PSN of the request the responder is handling now: the packet that
  // came, until the stages name the one they run (a kept one, for one).
  void handling(uint32_t psn) { psn_ = psn; }
  void running(uint32_t psn) override { psn_ = psn; }
  void deregister(uint32_t key) { fake_.keys.erase(key); }
  void deregister_all() { fake_.keys.clear(); }
  void register_all() { fake_.keys = all_keys_; }

  void check_guards() {
    for (std::size_t i = 0; i < fake_.memory.size(); ++i) {
      if (i == kGuard) i += kRegistered;
      if (i < fake_.memory.size() && fake_.memory[i] != kPattern) broken("no byte written outside the registered range");
    }
  }

  transport::ResponderQp qp() override { return fake_.qp(); }
  std::optional<transport::MemoryKey> memory_key(uint32_t key) override { return fake_.memory_key(key); }
  bool take_receive(transport::ReceiveWqe& out) override {
    if (!fake_.take_receive(out)) return false;
    if (!taken_.insert(out.wr_id).second) broken("each receive WQE is taken once");
    return true;
  }
  transport::CopyStatus write(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override {
    uint64_t left = length;
    for (int i = 0; i < nto && left > 0; ++i) {
      const uint64_t n = std::min<uint64_t>(to[i].iov_len, left);
      writable(to[i].iov_base, n);
      left -= n;
    }
    return fake_.write(to, nto, from, nfrom, length);
  }
  transport::CopyStatus read(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override {
    return fake_.read(to, nto, from, nfrom, length);
  }
  transport::CopyStatus atomic(void* word, transport::AtomicOp op, uint64_t compare_add, uint64_t swap,
                               uint64_t& original) override {
    writable(word, 8);
    if (!atomic_psns_.insert(psn_).second) broken("an atomic runs once per request PSN");
    return fake_.atomic(word, op, compare_add, swap, original);
  }
  void complete_receive(const transport::ReceiveCompletion& c) override {
    if (taken_.count(c.wr_id) == 0) broken("a receive completes only a WQE taken");
    if (!completed_.insert(c.wr_id).second) broken("a receive WQE completes once");
    fake_.complete_receive(c);
  }
  bool invalidate(uint32_t rkey) override { return fake_.invalidate(rkey); }
  void fail_qp(ibv_event_type event) override { fake_.fail_qp(event); }
  void established() override { fake_.established(); }
  bool gone() override { return fake_.gone(); }

 private:
  uint8_t* registered_begin() { return fake_.memory.data() + kGuard; }

  // Only kKey, registered now, grants writes to the QP's PD (the others are
  // read-only or another PD's): whatever is written must lie inside it.
  void writable(const void* at, uint64_t n) {
    if (n == 0) return;
    const auto mr = fake_.memory_key(transport::kKey);
    if (!mr) broken("nothing is written through a key no longer registered");
    const auto p = reinterpret_cast<uint64_t>(at);
    if (p < mr->host_addr || p + n > mr->host_addr + mr->length) broken("writes stay inside the registered range");
  }

  transport::FakePort fake_;
  std::map<uint32_t, transport::MemoryKey> all_keys_;
  uint32_t psn_ = 0;
  std::set<uint32_t> atomic_psns_;
  std::set<uint64_t> taken_, completed_;
};

}  // namespace softhca::fuzz
