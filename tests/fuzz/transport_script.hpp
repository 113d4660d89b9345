// The input format of transport_flows_fuzz.cpp, shared with the generator of
// valid scripts (transport_flows_target.cpp): a few configuration bytes, then
// steps. Every byte string is a script: a step's operands that run past the
// end read as zero, and a step code is taken modulo the number of steps, so
// that a mutation changes what a script does rather than making it invalid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softhca::fuzz::script {

// The configuration, kConfigBytes at the start:
//   0: bits 0-1 MTU (256 << n, 3: 4096), bit 2 UC, bits 3-5 retry_cnt
//   1: bits 0-2 rnr_retry, bits 3-7 the ACK timeout code (0: wait for ever)
//   2: start PSN: 0 near the 24-bit wrap (0xFFFFFF - byte 3), 1 bytes 3-5, 2 zero, 3 0x1000
//   3-5: PSN bits
//   6: bits 0-2 responder resources - 1, bits 3-7 min_rnr_timer
//   7: bit 7 set: the responder QP's remote access is bits 0-2 (WRITE, READ, ATOMIC) only
inline constexpr std::size_t kConfigBytes = 8;

// A step is a code byte and its operands.
enum Step : uint8_t {
  kPost,          // op, length class, remote class, rkey class, value: one message on the requester
  kToResponder,   // count, then a fault byte per packet: the requester's packets to the responder
  kToRequester,   // count, then a fault byte per packet: the responder's packets to the requester
  kTimer,         // mode, amount: advance the virtual clock and fire the requester's timer
  kForgeRequest,  // opcode, PSN, flags, RETH/AtomicETH, payload, origin: a request from nobody's requester
  kForgeResponse, // opcode, PSN, syndrome, payload, origin: a response from nobody's responder
                  // (origin % 8: 0-4 the peer, 5 a third host, 6 to another address, 7 another P_Key)
  kPostReceive,   // address class, length class, lkey class: a receive WQE on the responder
  kKeys,          // which: deregister the key, or all, or register them again
  kRun,           // rounds: both ways without faults, timers as they fall due
  kAbort,         // operand kAbortNow: the requester's QP is torn down (its messages flushed)
  kStepCount,
};

inline constexpr uint8_t kAbortNow = 0xA5;

// Per packet delivered by kToResponder / kToRequester, fault % 8:
//   0-3 delivered, 4 lost, 5 delivered twice, 6 overtaken by the rest, 7 a byte
//   changed (then `fault & 0x80`: its ICRC made valid again, so that it parses).
enum Fault : uint8_t { kLost = 4, kTwice = 5, kLate = 6, kCorrupt = 7 };

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  uint8_t u8() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }

 private:
  std::span<const uint8_t> bytes_;
  std::size_t at_ = 0;
};

}  // namespace softhca::fuzz::script
