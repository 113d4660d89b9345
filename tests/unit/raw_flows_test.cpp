// The host's raw flow table (host/raw_flows) with private files: entries in
// and out, the generation that tells readers to rebuild, a full table, and
// entries of processes that are gone (skipped by readers, taken back when
// the table is full).
#include "host/raw_flows.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "host/host_registry.hpp"

namespace softhca::host {
namespace {

class RawFlowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/softhca-unit-raw-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto registry = HostRegistry::open_named(dir_ + "/registry", true);
    ASSERT_TRUE(registry.has_value());
    registry_ = *registry;
    auto proc = registry_->register_process(pid_, 3);
    ASSERT_TRUE(proc.has_value());
    proc_ = *proc;
    auto table = RawFlows::open_in(dir_);
    ASSERT_TRUE(table.has_value());
    table_ = *table;
  }
  void TearDown() override {
    delete table_;
    delete registry_;
    std::remove((dir_ + "/raw-flows-v2").c_str());
    ::rmdir(dir_.c_str());
  }

  std::string dir_;
  HostRegistry* registry_ = nullptr;
  RawFlows* table_ = nullptr;
  uint32_t proc_ = 0;
  const uint32_t pid_ = static_cast<uint32_t>(::getpid());
  // This process, and processes that are gone: another pid in our slot, or
  // our very pid in our slot but started at another time (a pid come round).
  ProcessIdentity me() const { return registry_->identity_of(proc_); }
  ProcessIdentity other_pid() const { return ProcessIdentity{proc_, pid_ + 1, me().start_time}; }
  ProcessIdentity our_pid_earlier() const { return ProcessIdentity{proc_, pid_, me().start_time - 1}; }
};

TEST_F(RawFlowsTest, AddAndRemoveMoveTheGeneration) {
  const uint64_t g0 = table_->generation();
  const char payload[] = "rule";
  ASSERT_TRUE(table_->add(me(), 7, payload, sizeof payload, *registry_).has_value());
  EXPECT_GT(table_->generation(), g0);
  std::vector<RawFlowEntry> entries;
  uint64_t seen = 0;
  table_->snapshot(entries, *registry_, seen);
  EXPECT_EQ(seen, table_->generation());
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].id, 7u);
  EXPECT_EQ(entries[0].payload_len, sizeof payload);
  EXPECT_STREQ(reinterpret_cast<const char*>(entries[0].payload), "rule");
  const uint64_t g1 = table_->generation();
  table_->remove(me(), 8);  // not there: nothing changes
  EXPECT_EQ(table_->generation(), g1);
  table_->remove(me(), 7);
  EXPECT_GT(table_->generation(), g1);
  table_->snapshot(entries, *registry_, seen);
  EXPECT_TRUE(entries.empty());
}

// A process that died left flow 1 under the slot we have now (its pid is
// not ours); our own flow 1 is the one our removal takes. Removing by slot
// and id alone took the dead one's, and our flow went on steering frames
// after ibv_destroy_flow returned.
TEST_F(RawFlowsTest, RemovalTakesTheFlowOfThisProcessNotOfAGoneOneInItsSlot) {
  const char payload[] = "x";
  ASSERT_TRUE(table_->add(other_pid(), 1, payload, sizeof payload, *registry_).has_value());
  ASSERT_TRUE(table_->add(me(), 1, payload, sizeof payload, *registry_).has_value());
  std::vector<RawFlowEntry> entries;
  uint64_t seen = 0;
  table_->snapshot(entries, *registry_, seen);
  ASSERT_EQ(entries.size(), 1u) << "the gone process's flow is skipped";
  table_->remove(me(), 1);
  table_->snapshot(entries, *registry_, seen);
  EXPECT_TRUE(entries.empty()) << "our flow is still in the table";
}

// The same with the pid: a process that died in our slot had our pid (pids
// come round within minutes on a busy host). Its flow 1 is not ours either:
// skipped by readers, left by our removal, taken back when the table is full.
// This was RawFlowFence's rare failure after the fix above: the dead
// process's flow was removed in place of ours, which went on steering.
TEST_F(RawFlowsTest, AFlowOfAnEarlierProcessWithOurPidInOurSlotIsNotOurs) {
  ASSERT_GT(me().start_time, 0u);
  const char payload[] = "x";
  ASSERT_TRUE(table_->add(our_pid_earlier(), 1, payload, sizeof payload, *registry_).has_value());
  ASSERT_TRUE(table_->add(me(), 1, payload, sizeof payload, *registry_).has_value());
  std::vector<RawFlowEntry> entries;
  uint64_t seen = 0;
  table_->snapshot(entries, *registry_, seen);
  ASSERT_EQ(entries.size(), 1u) << "the earlier process's flow is skipped";
  EXPECT_EQ(entries[0].start_time, me().start_time);
  table_->remove(me(), 1);
  table_->snapshot(entries, *registry_, seen);
  EXPECT_TRUE(entries.empty()) << "our flow is still in the table";
  // Full of the earlier process's entries: they make room.
  for (uint32_t i = 0; i + 1 < kMaxRawFlows; ++i)
    ASSERT_TRUE(table_->add(our_pid_earlier(), 100 + i, payload, sizeof payload, *registry_).has_value());
  for (uint32_t i = 0; i < kMaxRawFlows; ++i)
    ASSERT_TRUE(table_->add(me(), 1000 + i, payload, sizeof payload, *registry_).has_value()) << "entry " << i;
}

TEST_F(RawFlowsTest, OversizedPayloadIsRefused) {
  std::vector<unsigned char> big(kRawFlowPayloadBytes + 1);
  EXPECT_EQ(table_->add(me(), 1, big.data(), big.size(), *registry_).error(), std::errc::invalid_argument);
}

TEST_F(RawFlowsTest, GoneProcessesAreSkippedAndTakenBackWhenFull) {
  const char payload[] = "x";
  for (uint32_t i = 0; i < kMaxRawFlows; ++i)
    ASSERT_TRUE(table_->add(i % 2 ? other_pid() : me(), i, payload, sizeof payload, *registry_).has_value());
  std::vector<RawFlowEntry> entries;
  uint64_t seen = 0;
  table_->snapshot(entries, *registry_, seen);
  EXPECT_EQ(entries.size(), kMaxRawFlows / 2);  // only the live process's
  // Full: the gone process's entries make room.
  ASSERT_TRUE(table_->add(me(), 1000, payload, sizeof payload, *registry_).has_value());
  // Fill up with live entries: then the table is full for good.
  uint32_t added = 1;
  while (table_->add(me(), 2000 + added, payload, sizeof payload, *registry_).has_value()) ++added;
  EXPECT_EQ(added, kMaxRawFlows / 2);
  EXPECT_EQ(table_->add(me(), 9999, payload, sizeof payload, *registry_).error(),
            std::errc::not_enough_memory);
}

}  // namespace
}  // namespace softhca::host
