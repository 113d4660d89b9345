// A ResponderPort whose QP, keys, receive queue and memory live in the test:
// the responder's and the packet flows' unit tests drive it.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "transport/responder_port.hpp"

namespace softhca::transport {

constexpr uint32_t kPd = 7;
constexpr uint32_t kOtherPd = 8;
constexpr uint32_t kKey = 0x1234;
constexpr uint32_t kOtherPdKey = 0x2345;
constexpr uint32_t kReadOnlyKey = 0x3456;
constexpr uint64_t kIova = 0x10000;

class FakePort : public ResponderPort {
 public:
  explicit FakePort(size_t bytes = 4096) : memory(bytes, 0) {
    qp_.type = IBV_QPT_RC;
    qp_.state = IBV_QPS_RTS;
    qp_.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    qp_.pd_id = kPd;
    qp_.receive_pd_id = kPd;
    qp_.qkey = 0x11;
    qp_.min_rnr_timer = 12;
    qp_.max_dest_rd_atomic = 4;
    const uint64_t host = reinterpret_cast<uint64_t>(memory.data());
    const uint32_t all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                         IBV_ACCESS_REMOTE_ATOMIC;
    keys[kKey] = MemoryKey{kKey, kPd, all, kIova, memory.size(), host};
    keys[kOtherPdKey] = MemoryKey{kOtherPdKey, kOtherPd, all, kIova, memory.size(), host};
    keys[kReadOnlyKey] = MemoryKey{kReadOnlyKey, kPd, IBV_ACCESS_REMOTE_READ, kIova, memory.size(), host};
  }

  ResponderQp qp() override { return qp_; }
  std::optional<MemoryKey> memory_key(uint32_t key) override {
    auto it = keys.find(key);
    if (it == keys.end()) return std::nullopt;
    return it->second;
  }
  bool take_receive(ReceiveWqe& out) override {
    if (receives.empty()) return false;
    out = receives.front();
    receives.pop_front();
    return true;
  }
  CopyStatus write(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override {
    if (copy_result != CopyStatus::kOk) return copy_result;
    copy(to, nto, from, nfrom, length);
    return CopyStatus::kOk;
  }
  CopyStatus read(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override {
    if (copy_result != CopyStatus::kOk) return copy_result;
    copy(to, nto, from, nfrom, length);
    return CopyStatus::kOk;
  }
  CopyStatus atomic(void* word, AtomicOp op, uint64_t compare_add, uint64_t swap, uint64_t& original) override {
    uint64_t value;
    std::memcpy(&value, word, 8);
    original = value;
    if (op == AtomicOp::kWrite) value = compare_add;
    if (op == AtomicOp::kFetchAdd) value += compare_add;
    if (op == AtomicOp::kCompareSwap && value == compare_add) value = swap;
    std::memcpy(word, &value, 8);
    return CopyStatus::kOk;
  }
  void complete_receive(const ReceiveCompletion& c) override { completions.push_back(c); }
  // A type 2 window of the QP's PD that is bound: unbound (length 0), as the registry does.
  bool invalidate(uint32_t rkey) override {
    auto it = keys.find(rkey);
    if (it == keys.end() || it->second.kind != KeyKind::kWindow2 || it->second.pd_id != qp_.pd_id ||
        it->second.length == 0)
      return false;
    it->second.length = 0;
    it->second.access = 0;
    invalidated.push_back(rkey);
    return true;
  }
  void fail_qp(ibv_event_type event) override {
    events.push_back(event);
    qp_.state = IBV_QPS_ERR;
  }
  void established() override { ++established_count; }
  bool gone() override { return is_gone; }

  void post_receive(uint64_t wr_id, uint64_t addr, uint32_t length, uint32_t lkey = kKey) {
    ReceiveWqe wqe;
    wqe.wr_id = wr_id;
    wqe.num_sge = 1;
    wqe.sge[0] = ReceiveSge{addr, length, lkey};
    receives.push_back(wqe);
  }
  unsigned char* at(uint64_t iova) { return memory.data() + (iova - kIova); }

  ResponderQp qp_;
  std::vector<unsigned char> memory;
  std::map<uint32_t, MemoryKey> keys;
  std::deque<ReceiveWqe> receives;
  std::vector<ReceiveCompletion> completions;
  std::vector<uint32_t> invalidated;
  std::vector<ibv_event_type> events;
  int established_count = 0;
  bool is_gone = false;
  CopyStatus copy_result = CopyStatus::kOk;

 private:
  static void copy(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) {
    std::vector<unsigned char> bytes;
    for (int i = 0; i < nfrom; ++i) {
      const auto* p = static_cast<const unsigned char*>(from[i].iov_base);
      bytes.insert(bytes.end(), p, p + from[i].iov_len);
    }
    bytes.resize(length);
    uint64_t done = 0;
    for (int i = 0; i < nto && done < length; ++i) {
      const uint64_t n = std::min<uint64_t>(to[i].iov_len, length - done);
      std::memcpy(to[i].iov_base, bytes.data() + done, n);
      done += n;
    }
  }
};

}  // namespace softhca::transport
