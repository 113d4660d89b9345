// The fault schedule of the udp link (SOFTHCA_FAULT): which packets it drops,
// sends twice, holds back, delays or corrupts, so that tests can prove the
// reliable transport recovers from all of it.
//
// Reproducible by design: the decision for the n-th packet is a pure function
// of the seed, n, the packet's size and the configured rates (a counter-based
// generator, splitmix64's mixer over seed and draw number), so
//   - the same SOFTHCA_FAULT gives the same decisions run after run;
//   - changing one rate changes nothing else: the packets that are duplicated
//     at loss=0.01 are the packets duplicated at loss=0.2 (among those sent);
//   - next() is lock-free (one atomic counter), so the link may call it from
//     the application threads and its own thread alike. Which thread gets
//     which packet number is up to the scheduler; the decision for a number
//     is not.
// No clock, no I/O, no global state: the link reads the clock and applies
// the decisions.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace softhca::udp {

// The seed when SOFTHCA_FAULT names none: a fixed constant, so that two runs
// of an unseeded spec see the same faults too.
inline constexpr uint64_t kDefaultFaultSeed = 0x5eed'50f7'4ca0'0001;

// The longest delay_us accepted, 10 s: longer than any retry wait a test
// would set, and a held packet beyond that only stalls the test.
inline constexpr uint32_t kMaxFaultDelayUs = 10'000'000;

// What SOFTHCA_FAULT asks for. Probabilities are in [0, 1]. `loss` is the
// fraction of all packets that are dropped; the other rates are fractions of
// the packets that are sent (not dropped), each drawn independently.
struct FaultConfig {
  double loss = 0;        // drop the packet
  double dup = 0;         // send it twice
  double reorder = 0;     // hold it back behind the next packet
  double delay = 1;       // delay it (only when delay_us > 0)
  uint32_t delay_us = 0;  // a delayed packet waits 1..delay_us us, uniformly drawn
  double corrupt = 0;     // flip bits of one byte
  uint64_t seed = kDefaultFaultSeed;

  // True when some packet may be affected: a rate above 0, or a delay.
  bool enabled() const;
  friend bool operator==(const FaultConfig&, const FaultConfig&) = default;
};

// Parses a SOFTHCA_FAULT value: comma-separated key=value items, spaces
// around keys and values allowed, each key at most once, e.g.
//   loss=0.05,dup=0.01,reorder=0.02,delay_us=200,corrupt=0.001,seed=7
// Keys: loss, dup, reorder, delay, corrupt (probabilities: decimal numbers
// such as 0.05 or 5e-2, from 0 to 1), delay_us (0..kMaxFaultDelayUs) and
// seed (0..2^64-1), both decimal. An empty (or all-space) value means no
// faults. The error names the item and what was wanted, e.g.
//   "loss=1.5: want a probability from 0 to 1".
std::expected<FaultConfig, std::string> parse_fault_spec(std::string_view spec);

// The canonical spec of `config`: every key, in the order above, numbers in
// their shortest exact form, so parse_fault_spec(to_string(c)) == c. For
// logs ("faults: loss=0.05,...,seed=7" says exactly what a run used).
std::string to_string(const FaultConfig& config);

// One byte to change: packet[index] ^= mask. mask is never 0, so a
// corruption always changes the byte.
struct Corruption {
  std::size_t index = 0;
  uint8_t mask = 0;
  friend bool operator==(const Corruption&, const Corruption&) = default;
};

// What to do with one packet the link is about to send.
//   drop:       do not send it; every other field is then false/0/empty.
//   corruption: change the byte before sending (apply_corruption); with
//               `duplicate`, both copies carry the changed byte.
//   duplicate:  send the same bytes twice, back to back.
//   hold_back:  send it after the next packet that is not itself held back
//               (a swap with its successor). If no packet follows within a
//               bound the link chooses (its delay bound or a timer of its
//               own), it sends it anyway, so a held packet is late, never
//               lost.
//   delay_us:   send it this many microseconds later than it would be
//               (0: no delay). Delays differ per packet, so delayed packets
//               may overtake each other: one more source of reordering.
struct FaultDecision {
  bool drop = false;
  bool duplicate = false;
  bool hold_back = false;
  uint32_t delay_us = 0;
  std::optional<Corruption> corruption;

  // False when the packet goes out once, unchanged, at once.
  bool any() const { return drop || duplicate || hold_back || delay_us != 0 || corruption.has_value(); }
  friend bool operator==(const FaultDecision&, const FaultDecision&) = default;
};

// The RoCEv2 byte the ICRC does not cover: BTH byte 4 (FECN, BECN and
// reserved bits, which switches may rewrite). A corruption never picks it,
// so every corrupted packet is one the receiver must drop: CRC-32 detects
// every change confined to one byte of what it covers.
inline constexpr std::size_t kIcrcUncoveredIndex = 4;

class FaultSchedule {
 public:
  explicit FaultSchedule(const FaultConfig& config) : config_(config) {}
  FaultSchedule(const FaultSchedule&) = delete;
  FaultSchedule& operator=(const FaultSchedule&) = delete;

  // The decision for the next packet, `packet_size` bytes long (the UDP
  // payload: BTH to ICRC). A packet of 0 bytes is never corrupted (nothing
  // to change). Thread-safe, lock-free.
  FaultDecision next(std::size_t packet_size);

  // The decision for packet number `n` (0-based) of this schedule: what
  // next() returns for its n-th call. Pure.
  FaultDecision decide(uint64_t n, std::size_t packet_size) const;

  // How many decisions next() has made.
  uint64_t packets() const { return next_packet_.load(std::memory_order_relaxed); }

  const FaultConfig& config() const { return config_; }

 private:
  FaultConfig config_;
  std::atomic<uint64_t> next_packet_{0};
};

// Applies `c` to `packet`: packet[c.index] ^= c.mask. false (and nothing
// changed) when the index is past the end, which a decision made for this
// packet's size never is.
bool apply_corruption(const Corruption& c, std::span<uint8_t> packet);

// Reads SOFTHCA_FAULT (common/settings, read when the caller asks): nullopt
// when it is unset or empty, or asks for no fault; otherwise its
// configuration. A value that does not parse is ignored like any bad
// setting: one warning (once per process) that says why, and no faults.
std::optional<FaultConfig> fault_config_from_environment();

// The same for a given text (nullptr: unset): the function above without the
// environment, for tests. The warning, if any, goes to `warning`.
std::optional<FaultConfig> fault_config_from_text(const char* text, std::string* warning);

}  // namespace softhca::udp
