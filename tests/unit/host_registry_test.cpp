// The host registry with a private file: QPN and MR-key allocation, lookup,
// key validation, rereg, multicast groups, and reclaiming what a dead process held.
#include "host/host_registry.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <set>
#include <string>

#include "common/limits.hpp"
#include "transport/ibta_timers.hpp"

namespace softhca::host {
namespace {

class HostRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = "/dev/shm/softhca-unit-" + std::to_string(::getpid()) + "-" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto opened = HostRegistry::open_named(path, true);
    ASSERT_TRUE(opened.has_value());
    registry_ = *opened;
    auto proc = registry_->register_process(static_cast<uint32_t>(::getpid()), 3);
    ASSERT_TRUE(proc.has_value());
    proc_ = *proc;
  }
  void TearDown() override { delete registry_; }
  HostRegistry* registry_ = nullptr;
  uint32_t proc_ = 0;
};

TEST_F(HostRegistryTest, QpnsAreUniqueAndFindable) {
  std::set<uint32_t> seen;
  for (int i = 0; i < 100; ++i) {
    auto qpn = registry_->allocate_qpn(proc_, 0x1000 + i);
    ASSERT_TRUE(qpn.has_value());
    EXPECT_GE(*qpn, kFirstQpn);
    EXPECT_TRUE(seen.insert(*qpn).second);
    const QpSlot* slot = registry_->find_qp(*qpn);
    ASSERT_NE(slot, nullptr);
    EXPECT_EQ(slot->shm_offset, 0x1000u + i);
  }
  const uint32_t some = *seen.begin();
  registry_->release_qpn(some);
  EXPECT_EQ(registry_->find_qp(some), nullptr);
  EXPECT_EQ(registry_->find_qp(0), nullptr);
  EXPECT_EQ(registry_->find_qp(0xFFFFFF), nullptr);
}

// max_qp and max_mr are these tables: the device limit is host-wide and the
// one past it fails with ENOMEM, as a device at its limit does.
TEST_F(HostRegistryTest, QpnTableHoldsExactlyMaxQp) {
  static_assert(limits::kMaxQp == static_cast<int>(kMaxQpSlots));
  uint32_t last = 0;
  for (int i = 0; i < limits::kMaxQp; ++i) {
    auto qpn = registry_->allocate_qpn(proc_, 0x1000);
    ASSERT_TRUE(qpn.has_value()) << i;
    last = *qpn;
  }
  auto over = registry_->allocate_qpn(proc_, 0x1000);
  ASSERT_FALSE(over.has_value());
  EXPECT_EQ(over.error(), std::errc::not_enough_memory);
  registry_->release_qpn(last);
  auto again = registry_->allocate_qpn(proc_, 0x1000);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, last);
}

TEST_F(HostRegistryTest, MrTableHoldsExactlyMaxMr) {
  static_assert(limits::kMaxMr == static_cast<int>(kMaxMrSlots));
  uint32_t last = 0;
  for (int i = 0; i < limits::kMaxMr; ++i) {
    auto key = registry_->allocate_mr(proc_, 1, 0, 0, 4096, 0x7f0000);
    ASSERT_TRUE(key.has_value()) << i;
    last = *key;
  }
  auto over = registry_->allocate_mr(proc_, 1, 0, 0, 4096, 0x7f0000);
  ASSERT_FALSE(over.has_value());
  EXPECT_EQ(over.error(), std::errc::not_enough_memory);
  registry_->release_mr(last);
  EXPECT_TRUE(registry_->allocate_mr(proc_, 1, 0, 0, 4096, 0x7f0000).has_value());
}

TEST_F(HostRegistryTest, MrKeysValidateAndDieWithDereg) {
  auto key = registry_->allocate_mr(proc_, 7, 0x3, 0x10000, 4096, 0x7f0000);
  ASSERT_TRUE(key.has_value());
  MrRecord mr;
  ASSERT_TRUE(registry_->lookup_mr(*key, mr));
  EXPECT_EQ(mr.pd_id, 7u);
  EXPECT_EQ(mr.iova, 0x10000u);
  EXPECT_EQ(mr.length, 4096u);
  EXPECT_EQ(mr.host_addr, 0x7f0000u);
  // A key with the right slot but another tag is not this MR.
  EXPECT_FALSE(registry_->lookup_mr(*key ^ 0x1, mr));
  EXPECT_FALSE(registry_->lookup_mr(0, mr));
  registry_->update_mr(*key, 8, 0x1, 0x20000, 8192, 0x7f1000);
  ASSERT_TRUE(registry_->lookup_mr(*key, mr));
  EXPECT_EQ(mr.pd_id, 8u);
  EXPECT_EQ(mr.length, 8192u);
  registry_->release_mr(*key);
  EXPECT_FALSE(registry_->lookup_mr(*key, mr));
}

TEST_F(HostRegistryTest, KeysOfReusedSlotsDiffer) {
  std::set<uint32_t> keys;
  for (int i = 0; i < 50; ++i) {
    auto key = registry_->allocate_mr(proc_, 1, 0, 0, 1, 0);
    ASSERT_TRUE(key.has_value());
    EXPECT_NE(*key, 0u);
    EXPECT_TRUE(keys.insert(*key).second);
    registry_->release_mr(*key);
  }
}

TEST_F(HostRegistryTest, DeadProcessResourcesAreReclaimed) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Register the (now dead) child as if it had died holding a QP and an MR.
  auto dead = registry_->register_process(static_cast<uint32_t>(child), 3);
  ASSERT_TRUE(dead.has_value());
  auto qpn = registry_->allocate_qpn(*dead, 64);
  auto key = registry_->allocate_mr(*dead, 1, 0, 0, 1, 0);
  ASSERT_TRUE(qpn.has_value() && key.has_value());
  EXPECT_FALSE(registry_->process_alive(*dead));
  EXPECT_TRUE(registry_->process_alive(proc_));
  // The next registration sweeps dead owners.
  auto next = registry_->register_process(static_cast<uint32_t>(::getpid()), 4);
  ASSERT_TRUE(next.has_value());
  // A live process may now hold the dead one's slot: asked by pid, the dead
  // one is still dead.
  if (*next == *dead) {
    EXPECT_TRUE(registry_->process_alive(*dead));
  }
  EXPECT_FALSE(registry_->process_alive(*dead, static_cast<uint32_t>(child)));
  EXPECT_TRUE(registry_->process_alive(*next, static_cast<uint32_t>(::getpid())));
  EXPECT_EQ(registry_->find_qp(*qpn), nullptr);
  MrRecord mr;
  EXPECT_FALSE(registry_->lookup_mr(*key, mr));
}

constexpr uint8_t kGroupA[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1};
constexpr uint8_t kGroupB[16] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42};

TEST_F(HostRegistryTest, McastGroupsListTheirMembers) {
  uint32_t members[kMaxMcastMembers];
  EXPECT_EQ(registry_->mcast_members(kGroupA, members), 0u);
  ASSERT_TRUE(registry_->attach_mcast(kGroupA, 0x20, proc_).has_value());
  ASSERT_TRUE(registry_->attach_mcast(kGroupA, 0x21, proc_).has_value());
  ASSERT_TRUE(registry_->attach_mcast(kGroupA, 0x21, proc_).has_value());  // twice: no-op
  ASSERT_TRUE(registry_->attach_mcast(kGroupB, 0x21, proc_).has_value());
  ASSERT_EQ(registry_->mcast_members(kGroupA, members), 2u);
  EXPECT_EQ(std::set<uint32_t>(members, members + 2), (std::set<uint32_t>{0x20, 0x21}));
  ASSERT_EQ(registry_->mcast_members(kGroupB, members), 1u);
  EXPECT_EQ(members[0], 0x21u);
  ASSERT_TRUE(registry_->detach_mcast(kGroupA, 0x20).has_value());
  EXPECT_EQ(registry_->detach_mcast(kGroupA, 0x20).error(), std::errc::invalid_argument);
  EXPECT_EQ(registry_->detach_mcast(kGroupB, 0x20).error(), std::errc::invalid_argument);
  ASSERT_EQ(registry_->mcast_members(kGroupA, members), 1u);
  EXPECT_EQ(members[0], 0x21u);
}

TEST_F(HostRegistryTest, McastGroupFillsUp) {
  for (uint32_t i = 0; i < kMaxMcastMembers; ++i)
    ASSERT_TRUE(registry_->attach_mcast(kGroupA, 0x100 + i, proc_).has_value());
  EXPECT_EQ(registry_->attach_mcast(kGroupA, 0x1000, proc_).error(), std::errc::not_enough_memory);
  uint32_t members[kMaxMcastMembers];
  EXPECT_EQ(registry_->mcast_members(kGroupA, members), kMaxMcastMembers);
}

TEST_F(HostRegistryTest, ReleasedQpsAndDeadProcessesLeaveTheirGroups) {
  auto qpn = registry_->allocate_qpn(proc_, 0);
  ASSERT_TRUE(qpn.has_value());
  ASSERT_TRUE(registry_->attach_mcast(kGroupA, *qpn, proc_).has_value());
  registry_->release_qpn(*qpn);
  uint32_t members[kMaxMcastMembers];
  EXPECT_EQ(registry_->mcast_members(kGroupA, members), 0u);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto dead = registry_->register_process(static_cast<uint32_t>(child), 3);
  ASSERT_TRUE(dead.has_value());
  ASSERT_TRUE(registry_->attach_mcast(kGroupB, 0x30, *dead).has_value());
  ASSERT_TRUE(registry_->attach_mcast(kGroupB, 0x31, proc_).has_value());
  auto next = registry_->register_process(static_cast<uint32_t>(::getpid()), 4);
  ASSERT_TRUE(next.has_value());
  ASSERT_EQ(registry_->mcast_members(kGroupB, members), 1u);
  EXPECT_EQ(members[0], 0x31u);
}

TEST_F(HostRegistryTest, GsiAgentIsTheFirstLiveClaimantUntilItLeaves) {
  EXPECT_FALSE(registry_->gsi_agent().has_value());
  registry_->claim_gsi_agent(proc_);
  EXPECT_EQ(registry_->gsi_agent(), proc_);
  // A second live process does not take it over.
  auto other = registry_->register_process(static_cast<uint32_t>(::getpid()), 4);
  ASSERT_TRUE(other.has_value());
  registry_->claim_gsi_agent(*other);
  EXPECT_EQ(registry_->gsi_agent(), proc_);
  // The agent leaves: nobody is, until the next claim.
  registry_->unregister_process(proc_);
  EXPECT_FALSE(registry_->gsi_agent().has_value());
  registry_->claim_gsi_agent(*other);
  EXPECT_EQ(registry_->gsi_agent(), *other);
}

TEST_F(HostRegistryTest, DeadGsiAgentIsReplacedByTheNextClaimant) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto dead = registry_->register_process(static_cast<uint32_t>(child), 3);
  ASSERT_TRUE(dead.has_value());
  registry_->claim_gsi_agent(*dead);  // as if it had claimed while alive
  EXPECT_EQ(registry_->gsi_agent(), *dead);
  registry_->claim_gsi_agent(proc_);
  EXPECT_EQ(registry_->gsi_agent(), proc_);
}

TEST(IbtaTimers, RnrTimerTableEndpoints) {
  EXPECT_EQ(transport::rnr_timer_ns(0), 655'360'000u);  // code 0 is the longest, 655.36 ms
  EXPECT_EQ(transport::rnr_timer_ns(1), 10'000u);
  EXPECT_EQ(transport::rnr_timer_ns(12), 640'000u);
  EXPECT_EQ(transport::rnr_timer_ns(31), 491'520'000u);
}

TEST(IbtaTimers, AckTimeoutDoublesAndZeroIsInfinite) {
  EXPECT_EQ(transport::ack_timeout_ns(0), 0u);
  EXPECT_EQ(transport::ack_timeout_ns(1), 8192u);
  EXPECT_EQ(transport::ack_timeout_ns(14), 4096ull << 14);
}

}  // namespace
}  // namespace softhca::host

namespace softhca::host {
namespace {

// Whether fence_accesses(target) returns within a generous bound (a fence
// that waits on nothing must not hang; a hang would also fail by timeout).
bool fence_returns(HostRegistry& registry, uint32_t target) {
  auto done = std::async(std::launch::async, [&] { registry.fence_accesses(target); });
  return done.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
}

// The deregistration fence: an access held by a process that died does not
// hold up a deregistration forever, and accesses to other processes never do.
TEST_F(HostRegistryTest, FenceIgnoresAccessesOfOtherTargetsAndOfTheDead) {
  const uint32_t other_target = proc_ + 1;
  const uint32_t mine = registry_->begin_access(proc_, other_target);
  EXPECT_TRUE(fence_returns(*registry_, proc_)) << "an access to another target held up the fence";
  registry_->end_access(proc_, mine);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Register the (now dead) child as if it had died inside an access to us.
  auto dead = registry_->register_process(static_cast<uint32_t>(child), 3);
  ASSERT_TRUE(dead.has_value());
  registry_->begin_access(*dead, proc_);
  EXPECT_TRUE(fence_returns(*registry_, proc_)) << "a dead accessor held up the fence";
  // A released slot is free for the next access, and a fence after it has nothing to wait for.
  const uint32_t again = registry_->begin_access(proc_, proc_);
  EXPECT_LT(again, kAccessSlotsPerProc);
  registry_->end_access(proc_, again);
  EXPECT_TRUE(fence_returns(*registry_, proc_)) << "an ended access held up the fence";
}

}  // namespace
}  // namespace softhca::host
