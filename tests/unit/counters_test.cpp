// Where the device's counters sit in a shared Counters set: every counter in
// a slot of its own, and the counters that initiators of other processes
// bump (the responder's) on cache lines apart from the owner's.
#include "common/counters.hpp"

#include <gtest/gtest.h>

#include <set>

namespace softhca {
namespace {

constexpr std::size_t kLineBytes = 64;

std::size_t line_of(const Counters& set, Counter c) {
  const auto* base = reinterpret_cast<const char*>(&set);
  return static_cast<std::size_t>(reinterpret_cast<const char*>(&set.at(c)) - base) / kLineBytes;
}

TEST(Counters, EveryCounterHasASlotOfItsOwn) {
  std::set<uint8_t> slots;
  for (std::size_t c = 0; c < kCounterCount; ++c) {
    EXPECT_LT(kCounterSlot[c], kCounterSlots) << kCounterInfo[c].name;
    EXPECT_TRUE(slots.insert(kCounterSlot[c]).second) << kCounterInfo[c].name << " shares a slot";
  }
}

TEST(Counters, InitiatorsAndOwnerNeverWriteTheSameCacheLine) {
  Counters set{};
  std::set<std::size_t> owner_lines, initiator_lines;
  for (std::size_t c = 0; c < kCounterCount; ++c) {
    const auto counter = static_cast<Counter>(c);
    (bumped_by_initiators(counter) ? initiator_lines : owner_lines).insert(line_of(set, counter));
  }
  ASSERT_FALSE(initiator_lines.empty());
  for (std::size_t line : initiator_lines) EXPECT_EQ(owner_lines.count(line), 0u) << "line " << line;
  // The pair that a ping-pong of SENDs bumps at every message.
  EXPECT_NE(line_of(set, Counter::kRdmaSends), line_of(set, Counter::kRdmaRecvs));
}

TEST(Counters, AddAndGetReachTheSameSlot) {
  Counters set{};
  for (std::size_t c = 0; c < kCounterCount; ++c) set.add(static_cast<Counter>(c), c + 1);
  for (std::size_t c = 0; c < kCounterCount; ++c) EXPECT_EQ(set.get(static_cast<Counter>(c)), c + 1);
}

}  // namespace
}  // namespace softhca
