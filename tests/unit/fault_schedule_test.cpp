// link/udp/fault_schedule: the SOFTHCA_FAULT parser and the seeded schedule
// of drops, duplicates, reorders, delays and corruptions. The schedule is
// deterministic, so every statistical check below has one outcome per seed;
// the tolerances (5 standard deviations) only say the rates are right.
#include "link/udp/fault_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/settings.hpp"

namespace softhca::udp {
namespace {

constexpr uint64_t kPackets = 200'000;
constexpr std::size_t kPacketSize = 64;

FaultConfig spec(std::string_view text) {
  auto config = parse_fault_spec(text);
  EXPECT_TRUE(config.has_value()) << text << ": " << config.error();
  return config.value_or(FaultConfig{});
}

std::string parse_error(std::string_view text) {
  auto config = parse_fault_spec(text);
  EXPECT_FALSE(config.has_value()) << "'" << text << "' parsed";
  return config ? std::string() : config.error();
}

// |observed - p| within 5 standard deviations of a binomial share of n.
void expect_rate(uint64_t hits, uint64_t n, double p, const char* what) {
  ASSERT_GT(n, 0u) << what;
  const double observed = static_cast<double>(hits) / static_cast<double>(n);
  const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_NEAR(observed, p, 5 * sigma + 1e-12) << what << ": " << hits << " of " << n;
}

// ---- parse_fault_spec ---------------------------------------------------------

TEST(FaultSpec, TheIssuesExampleParses) {
  const FaultConfig c = spec("loss=0.05,dup=0.01,reorder=0.02,delay_us=200,corrupt=0.001,seed=7");
  EXPECT_EQ(c.loss, 0.05);
  EXPECT_EQ(c.dup, 0.01);
  EXPECT_EQ(c.reorder, 0.02);
  EXPECT_EQ(c.delay, 1.0);
  EXPECT_EQ(c.delay_us, 200u);
  EXPECT_EQ(c.corrupt, 0.001);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_TRUE(c.enabled());
}

TEST(FaultSpec, EmptyMeansNoFaults) {
  for (const char* text : {"", "   "}) {
    const FaultConfig c = spec(text);
    EXPECT_EQ(c, FaultConfig{}) << "'" << text << "'";
    EXPECT_FALSE(c.enabled());
  }
}

TEST(FaultSpec, DefaultsAndSpacesAndNumberForms) {
  const FaultConfig c = spec(" loss = 5e-2 , delay=0.5,delay_us=10 ");
  EXPECT_EQ(c.loss, 0.05);
  EXPECT_EQ(c.delay, 0.5);
  EXPECT_EQ(c.delay_us, 10u);
  EXPECT_EQ(c.seed, kDefaultFaultSeed);
  EXPECT_EQ(spec("loss=0").loss, 0.0);
  EXPECT_EQ(spec("loss=1").loss, 1.0);
  EXPECT_EQ(spec("seed=18446744073709551615").seed, UINT64_MAX);
  EXPECT_EQ(spec("delay_us=10000000").delay_us, kMaxFaultDelayUs);
}

TEST(FaultSpec, NothingToDoIsNotEnabled) {
  EXPECT_FALSE(spec("seed=3").enabled());
  EXPECT_FALSE(spec("loss=0,dup=0,reorder=0,corrupt=0").enabled());
  EXPECT_FALSE(spec("delay_us=100,delay=0").enabled());  // nothing is delayed
  EXPECT_FALSE(spec("delay=1").enabled());                // delayed by nothing
  EXPECT_TRUE(spec("delay_us=1").enabled());
  EXPECT_TRUE(spec("corrupt=0.0001").enabled());
}

TEST(FaultSpec, UnknownKeysAreNamed) {
  EXPECT_EQ(parse_error("loss=0.1,drop=0.2"),
            "unknown key 'drop' (known: loss, dup, reorder, delay, delay_us, corrupt, seed)");
  EXPECT_EQ(parse_error("LOSS=0.1"), "unknown key 'LOSS' (known: loss, dup, reorder, delay, delay_us, corrupt, seed)");
  EXPECT_EQ(parse_error("=0.1"), "unknown key '' (known: loss, dup, reorder, delay, delay_us, corrupt, seed)");
}

TEST(FaultSpec, BadProbabilitiesAreNamed) {
  for (const char* bad : {"1.5", "-0.1", "abc", "", "0.1x", "nan", "inf", "+0.1", "0.1 0.2", "1e999"}) {
    EXPECT_EQ(parse_error(std::string("dup=") + bad), "dup=" + std::string(bad) + ": want a probability from 0 to 1")
        << bad;
  }
  EXPECT_EQ(parse_error("corrupt=2"), "corrupt=2: want a probability from 0 to 1");
}

TEST(FaultSpec, BadNumbersAreNamed) {
  EXPECT_EQ(parse_error("delay_us=10000001"), "delay_us=10000001: want microseconds from 0 to 10000000");
  EXPECT_EQ(parse_error("delay_us=-1"), "delay_us=-1: want microseconds from 0 to 10000000");
  EXPECT_EQ(parse_error("delay_us=0.5"), "delay_us=0.5: want microseconds from 0 to 10000000");
  EXPECT_EQ(parse_error("seed=18446744073709551616"),
            "seed=18446744073709551616: want a decimal number from 0 to 2^64-1");
  EXPECT_EQ(parse_error("seed=0x10"), "seed=0x10: want a decimal number from 0 to 2^64-1");
  EXPECT_EQ(parse_error("seed="), "seed=: want a decimal number from 0 to 2^64-1");
}

TEST(FaultSpec, BadShapesAreErrors) {
  EXPECT_EQ(parse_error("loss"), "'loss': want key=value");
  EXPECT_EQ(parse_error("loss=0.1,,dup=0.1"), "an empty item (two commas, or one at an end)");
  EXPECT_EQ(parse_error("loss=0.1,"), "an empty item (two commas, or one at an end)");
  EXPECT_EQ(parse_error(",loss=0.1"), "an empty item (two commas, or one at an end)");
  EXPECT_EQ(parse_error("loss=0.1,loss=0.2"), "'loss' is given twice");
}

TEST(FaultSpec, CanonicalTextParsesBack) {
  for (const char* text : {"", "loss=0.05,dup=0.01,reorder=0.02,delay_us=200,corrupt=0.001,seed=7",
                           "loss=0.3333333333333333,delay=0.25,delay_us=1,seed=18446744073709551615"}) {
    const FaultConfig c = spec(text);
    EXPECT_EQ(spec(to_string(c)), c) << to_string(c);
  }
  EXPECT_EQ(to_string(spec("loss=0.05,seed=7")), "loss=0.05,dup=0,reorder=0,delay=1,delay_us=0,corrupt=0,seed=7");
}

// ---- the environment's value ----------------------------------------------------

TEST(FaultEnvironment, UnsetEmptyOrHarmlessMeansNoSchedule) {
  std::string warning;
  EXPECT_FALSE(fault_config_from_text(nullptr, &warning).has_value());
  EXPECT_FALSE(fault_config_from_text("", &warning).has_value());
  EXPECT_FALSE(fault_config_from_text("seed=9", &warning).has_value());
  EXPECT_EQ(warning, "");
  auto c = fault_config_from_text("loss=0.2", &warning);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->loss, 0.2);
  EXPECT_EQ(warning, "");
}

TEST(FaultEnvironment, ABadValueIsIgnoredWithAWarningThatSaysWhy) {
  std::string warning;
  EXPECT_FALSE(fault_config_from_text("loss=5", &warning).has_value());
  EXPECT_EQ(warning,
            "ignoring SOFTHCA_FAULT 'loss=5' (loss=5: want a probability from 0 to 1); the udp link runs without "
            "faults");
}

TEST(FaultEnvironment, TheSettingIsInTheTable) {
  const Setting& s = setting(SettingId::kFault);
  EXPECT_EQ(s.name, "SOFTHCA_FAULT");
  EXPECT_EQ(setting_syntax(s), "loss=P,dup=P,reorder=P,delay=P,delay_us=N,corrupt=P,seed=N");
  EXPECT_FALSE(setting_problem(s, "anything").has_value());  // the link checks it
}

// ---- the schedule ---------------------------------------------------------------

std::vector<FaultDecision> run(const FaultConfig& config, uint64_t n, std::size_t size = kPacketSize) {
  FaultSchedule schedule(config);
  std::vector<FaultDecision> decisions;
  decisions.reserve(n);
  for (uint64_t i = 0; i < n; ++i) decisions.push_back(schedule.next(size));
  return decisions;
}

const FaultConfig kEverything = {
    .loss = 0.05, .dup = 0.01, .reorder = 0.02, .delay = 0.3, .delay_us = 200, .corrupt = 0.001, .seed = 7};

TEST(FaultSchedule, SameSeedSameDecisions) {
  EXPECT_EQ(run(kEverything, 20'000), run(kEverything, 20'000));
}

TEST(FaultSchedule, DifferentSeedsDiffer) {
  FaultConfig other = kEverything;
  other.seed = 8;
  const auto a = run(kEverything, 20'000);
  const auto b = run(other, 20'000);
  std::size_t same_drops = 0;
  std::size_t drops = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    drops += a[i].drop;
    same_drops += a[i].drop && b[i].drop;
  }
  EXPECT_NE(a, b);
  // Independent seeds share drops only by chance: about loss x drops of them.
  EXPECT_LT(same_drops, drops / 5) << same_drops << " of " << drops << " drops at the same packets";
}

TEST(FaultSchedule, NextIsDecideOfTheCount) {
  FaultSchedule schedule(kEverything);
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(schedule.next(100 + i % 7), schedule.decide(i, 100 + i % 7)) << i;
  EXPECT_EQ(schedule.packets(), 1000u);
}

TEST(FaultSchedule, RatesMatchTheConfiguration) {
  for (const uint64_t seed : {uint64_t{1}, uint64_t{7}, kDefaultFaultSeed}) {
    FaultConfig config = kEverything;
    config.seed = seed;
    uint64_t drops = 0, sent = 0, dups = 0, holds = 0, delays = 0, corrupts = 0, dup_and_hold = 0;
    for (const FaultDecision& d : run(config, kPackets)) {
      if (d.drop) {
        ++drops;
        EXPECT_FALSE(d.duplicate || d.hold_back || d.delay_us != 0 || d.corruption.has_value());
        continue;
      }
      ++sent;
      dups += d.duplicate;
      holds += d.hold_back;
      delays += d.delay_us != 0;
      corrupts += d.corruption.has_value();
      dup_and_hold += d.duplicate && d.hold_back;
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_rate(drops, kPackets, config.loss, "loss");
    expect_rate(dups, sent, config.dup, "dup");
    expect_rate(holds, sent, config.reorder, "reorder");
    expect_rate(delays, sent, config.delay, "delay");
    expect_rate(corrupts, sent, config.corrupt, "corrupt");
    // Drawn independently: both at once as often as the product says.
    expect_rate(dup_and_hold, sent, config.dup * config.reorder, "dup and reorder");
  }
}

TEST(FaultSchedule, RateZeroNeverRateOneAlways) {
  for (const FaultDecision& d : run(FaultConfig{.delay_us = 0, .seed = 3}, 50'000)) EXPECT_FALSE(d.any());
  for (const FaultDecision& d : run(FaultConfig{.loss = 1}, 50'000)) ASSERT_TRUE(d.drop);
  for (const FaultDecision& d : run(FaultConfig{.dup = 1, .reorder = 1, .delay = 1, .delay_us = 5, .corrupt = 1},
                                    50'000)) {
    ASSERT_FALSE(d.drop);
    ASSERT_TRUE(d.duplicate);
    ASSERT_TRUE(d.hold_back);
    ASSERT_NE(d.delay_us, 0u);
    ASSERT_TRUE(d.corruption.has_value());
  }
}

TEST(FaultSchedule, OneRateDoesNotMoveTheOthers) {
  // The packets duplicated (or held, delayed, corrupted) at 1% loss are the
  // ones at 20% loss, among those both send: what a test sees changes only
  // where it changed something.
  FaultConfig low = kEverything;
  FaultConfig high = kEverything;
  low.loss = 0.01;
  high.loss = 0.2;
  const auto a = run(low, 50'000);
  const auto b = run(high, 50'000);
  std::size_t compared = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].drop || b[i].drop) continue;
    ++compared;
    ASSERT_EQ(a[i], b[i]) << "packet " << i;
  }
  EXPECT_GT(compared, 35'000u);
}

TEST(FaultSchedule, DelaysAreUniformFromOneToTheMaximum) {
  constexpr uint32_t kMax = 4;
  std::vector<uint64_t> count(kMax + 1);
  uint64_t delayed = 0;
  for (const FaultDecision& d : run(FaultConfig{.delay = 1, .delay_us = kMax}, kPackets)) {
    ASSERT_GE(d.delay_us, 1u);
    ASSERT_LE(d.delay_us, kMax);
    ++count[d.delay_us];
    ++delayed;
  }
  for (uint32_t us = 1; us <= kMax; ++us) expect_rate(count[us], delayed, 1.0 / kMax, "delay value");

  uint64_t sum = 0;
  const auto wide = run(FaultConfig{.delay = 1, .delay_us = 200}, kPackets);
  for (const FaultDecision& d : wide) sum += d.delay_us;
  // Uniform on 1..200: mean 100.5, standard deviation about 57.7.
  EXPECT_NEAR(static_cast<double>(sum) / kPackets, 100.5, 5 * 57.7 / std::sqrt(double{kPackets}));
}

TEST(FaultSchedule, CorruptionAlwaysChangesACoveredByte) {
  const FaultConfig config{.corrupt = 1, .seed = 11};
  FaultSchedule schedule(config);
  std::vector<uint64_t> per_index(kPacketSize);
  for (uint64_t i = 0; i < kPackets; ++i) {
    const FaultDecision d = schedule.next(kPacketSize);
    ASSERT_TRUE(d.corruption.has_value());
    ASSERT_LT(d.corruption->index, kPacketSize);
    ASSERT_NE(d.corruption->index, kIcrcUncoveredIndex) << "BTH byte 4 is not covered by the ICRC";
    ASSERT_NE(d.corruption->mask, 0) << "a corruption that changes nothing";
    ++per_index[d.corruption->index];

    std::vector<uint8_t> packet(kPacketSize);
    for (std::size_t b = 0; b < packet.size(); ++b) packet[b] = static_cast<uint8_t>(i + b);
    const std::vector<uint8_t> before = packet;
    ASSERT_TRUE(apply_corruption(*d.corruption, packet));
    std::size_t changed = 0;
    for (std::size_t b = 0; b < packet.size(); ++b) changed += packet[b] != before[b];
    ASSERT_EQ(changed, 1u);
    ASSERT_NE(packet[d.corruption->index], before[d.corruption->index]);
  }
  // Every other byte equally likely.
  for (std::size_t b = 0; b < kPacketSize; ++b) {
    if (b == kIcrcUncoveredIndex) continue;
    expect_rate(per_index[b], kPackets, 1.0 / (kPacketSize - 1), "corrupted index");
  }
}

TEST(FaultSchedule, CorruptionFitsShortPackets) {
  FaultSchedule schedule(FaultConfig{.corrupt = 1});
  for (std::size_t size = 0; size <= 6; ++size) {
    for (int i = 0; i < 2000; ++i) {
      const FaultDecision d = schedule.next(size);
      if (size == 0) {
        ASSERT_FALSE(d.corruption.has_value()) << "nothing to corrupt in an empty packet";
        continue;
      }
      ASSERT_TRUE(d.corruption.has_value());
      ASSERT_LT(d.corruption->index, size);
      if (size > kIcrcUncoveredIndex) {
        ASSERT_NE(d.corruption->index, kIcrcUncoveredIndex);
      }
    }
  }
}

TEST(FaultSchedule, ApplyRefusesAnIndexPastTheEnd) {
  std::vector<uint8_t> packet(4, 0xAA);
  EXPECT_FALSE(apply_corruption(Corruption{.index = 4, .mask = 1}, packet));
  EXPECT_EQ(packet, std::vector<uint8_t>(4, 0xAA));
  EXPECT_TRUE(apply_corruption(Corruption{.index = 3, .mask = 0x0F}, packet));
  EXPECT_EQ(packet[3], 0xA5);
}

TEST(FaultSchedule, ThreadsShareOneSequence) {
  // Four threads draw 10,000 decisions each: together they make exactly the
  // decisions 0..39,999 of the schedule, each once.
  FaultSchedule schedule(kEverything);
  constexpr uint64_t kPerThread = 10'000;
  std::vector<std::vector<FaultDecision>> seen(4);
  std::vector<std::thread> threads;
  for (auto& out : seen)
    threads.emplace_back([&schedule, &out] {
      for (uint64_t i = 0; i < kPerThread; ++i) out.push_back(schedule.next(kPacketSize));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(schedule.packets(), 4 * kPerThread);
  // The same decisions in another order: the same tallies.
  struct Tally {
    uint64_t drops = 0, dups = 0, holds = 0, delay_sum = 0, corrupt_sum = 0;
    void add(const FaultDecision& d) {
      drops += d.drop;
      dups += d.duplicate;
      holds += d.hold_back;
      delay_sum += d.delay_us;
      if (d.corruption) corrupt_sum += d.corruption->index * 256 + d.corruption->mask;
    }
    bool operator==(const Tally&) const = default;
  };
  Tally from_threads, expected;
  for (const auto& out : seen)
    for (const FaultDecision& d : out) from_threads.add(d);
  for (const FaultDecision& d : run(kEverything, 4 * kPerThread)) expected.add(d);
  EXPECT_TRUE(from_threads == expected);
  EXPECT_GT(expected.drops, 0u);
}

}  // namespace
}  // namespace softhca::udp
