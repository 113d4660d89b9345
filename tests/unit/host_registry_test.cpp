// The host registry with a private file: QPN and MR-key allocation, lookup,
// key validation, rereg, multicast groups, reclaiming what a dead process held,
// and the access announcements that deregistration fences wait for.
#include "host/host_registry.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/limits.hpp"
#include "owned_access_slots.hpp"
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
  // The one free slot, under a QPN of its own (its page is drawn anew).
  EXPECT_EQ((*again - kFirstQpn) % kMaxQpSlots, (last - kFirstQpn) % kMaxQpSlots);
  EXPECT_NE(registry_->find_qp(*again), nullptr);
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

// Issue #40: seeing any number of keys or QPNs tells nothing about the
// next. Each is drawn from getrandom: a random slot to start from, a random
// key byte and a random high byte (a QPN's page). Here, over 2,000 of each,
// the draws must look like draws: every byte value about equally likely to
// turn up, and the next key not the last one's slot plus one (which a
// cursor gives every time). Bounds are far from what chance does: with
// 2,000 draws of 256 values fewer than 230 distinct ones, or more than 20
// slot successions, has a probability below 1e-9.
TEST_F(HostRegistryTest, KeysTellNothingAboutTheNext) {
  constexpr int kKeys = 2000;
  std::vector<uint32_t> keys;
  for (int i = 0; i < kKeys; ++i) {
    auto key = registry_->allocate_mr(proc_, 1, 0, 0, 4096, 0x7f0000);
    ASSERT_TRUE(key.has_value());
    keys.push_back(*key);
  }
  std::set<uint32_t> tags, highs;
  int successions = 0, same_tag_steps = 0;
  for (int i = 0; i < kKeys; ++i) {
    tags.insert(keys[i] & 0xFF);
    highs.insert(keys[i] >> 24);
    EXPECT_NE(keys[i] & 0xFF, 0u);
    MrRecord mr;
    EXPECT_TRUE(registry_->lookup_mr(keys[i], mr));
    if (i == 0) continue;
    if (((keys[i] >> 8) & 0xFFFF) == (((keys[i - 1] >> 8) + 1) & 0xFFFF)) ++successions;
    if ((keys[i] & 0xFF) == (keys[i - 1] & 0xFF)) ++same_tag_steps;
  }
  EXPECT_GE(tags.size(), 230u);
  EXPECT_GE(highs.size(), 230u);
  EXPECT_LE(successions, 20);
  EXPECT_LE(same_tag_steps, 40);  // about 8 by chance
}

TEST_F(HostRegistryTest, QpnsAreNotConsecutive) {
  constexpr int kQps = 2000;
  std::vector<uint32_t> qpns;
  std::set<uint32_t> pages;
  for (int i = 0; i < kQps; ++i) {
    auto qpn = registry_->allocate_qpn(proc_, 0x1000);
    ASSERT_TRUE(qpn.has_value());
    EXPECT_GE(*qpn, kFirstQpn);
    EXPECT_LE(*qpn, kLastQpn);
    ASSERT_NE(registry_->find_qp(*qpn), nullptr);
    pages.insert((*qpn - kFirstQpn) / kMaxQpSlots);
    qpns.push_back(*qpn);
  }
  int successions = 0;
  for (int i = 1; i < kQps; ++i)
    if (qpns[i] == qpns[i - 1] + 1) ++successions;
  EXPECT_LE(successions, 5);
  EXPECT_GE(pages.size(), 230u);
  // A QPN of another page in the same slot is not that slot's QP.
  const uint32_t other_page = qpns[0] + kMaxQpSlots <= kLastQpn ? qpns[0] + kMaxQpSlots : qpns[0] - kMaxQpSlots;
  EXPECT_EQ(registry_->find_qp(other_page), nullptr);
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


// XRC TGT QPs: the host's, alive while any handle is.
class TgtQpTest : public HostRegistryTest {
 protected:
  static constexpr uint32_t kDomain = 0x80000007;
  uint32_t pid() const { return static_cast<uint32_t>(::getpid()); }
  // A published TGT QP of kDomain with one handle (proc_, qp_id 1).
  uint32_t make_tgt() {
    auto made = registry_->create_tgt_qp(proc_, pid(), 1);
    EXPECT_TRUE(made.has_value());
    if (!made) return 0;
    made->record->shared.xrcd_id = kDomain;
    registry_->publish_qp(made->qpn);
    return made->qpn;
  }
  // A process registered under the pid of a child that has exited.
  uint32_t dead_process(uint32_t& dead_pid) {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    int status = 0;
    EXPECT_EQ(::waitpid(child, &status, 0), child);
    dead_pid = static_cast<uint32_t>(child);
    auto dead = registry_->register_process(dead_pid, 3);
    EXPECT_TRUE(dead.has_value());
    return dead.value_or(0);
  }
};

TEST_F(TgtQpTest, LivesWhileAnyHandleDoesAndOpensOnlyInItsDomain) {
  auto unpublished = registry_->create_tgt_qp(proc_, pid(), 9);
  ASSERT_TRUE(unpublished.has_value());
  unpublished->record->shared.xrcd_id = kDomain;
  // Nobody opens it before its creation is finished.
  EXPECT_EQ(registry_->open_tgt_qp(unpublished->qpn, kDomain, proc_, pid(), 10).error(),
            std::errc::invalid_argument);
  EXPECT_TRUE(registry_->close_tgt_qp(unpublished->qpn, proc_, 9));

  const uint32_t qpn = make_tgt();
  const QpSlot* slot = registry_->find_qp(qpn);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(slot->proc.load(), kHostOwned);
  TgtQpRecord* record = registry_->tgt_qp(qpn);
  ASSERT_NE(record, nullptr);
  EXPECT_EQ(registry_->open_tgt_qp(qpn, kDomain + 1, proc_, pid(), 2).error(), std::errc::invalid_argument);
  EXPECT_EQ(registry_->open_tgt_qp(qpn + 1, kDomain, proc_, pid(), 2).error(), std::errc::invalid_argument);
  auto opened = registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 2);
  ASSERT_TRUE(opened.has_value());
  EXPECT_EQ(*opened, record);
  TgtHandle holders[kMaxTgtHolders];
  ASSERT_EQ(registry_->tgt_holders(*record, holders), 2u);
  EXPECT_EQ(holders[0].qp_id, 1u);
  EXPECT_EQ(holders[1].qp_id, 2u);
  EXPECT_FALSE(registry_->close_tgt_qp(qpn, proc_, 1));  // the creator's handle: the QP stays
  EXPECT_EQ(registry_->tgt_qp(qpn), record);
  EXPECT_TRUE(registry_->close_tgt_qp(qpn, proc_, 2));   // the last one
  EXPECT_EQ(registry_->find_qp(qpn), nullptr);
  EXPECT_EQ(registry_->tgt_qp(qpn), nullptr);
  EXPECT_EQ(record->shared.state.load(), SharedQp::kDestroyed);
  EXPECT_EQ(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 3).error(), std::errc::invalid_argument);
}

TEST_F(TgtQpTest, ServicePassesToAnotherHandleWhenTheServerCloses) {
  const uint32_t qpn = make_tgt();
  TgtQpRecord* record = registry_->tgt_qp(qpn);
  ASSERT_NE(record, nullptr);
  ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 2).has_value());
  EXPECT_FALSE(registry_->tgt_server(qpn).has_value());
  auto before = registry_->with_tgt_qp(*record, [&](TgtQpRecord& r) { return registry_->serve_tgt_locked(r, proc_, 1); });
  EXPECT_FALSE(before.has_value());
  ASSERT_TRUE(registry_->tgt_server(qpn).has_value());
  EXPECT_EQ(registry_->tgt_server(qpn)->qp_id, 1u);
  // Handle 2 serves now; handle 1, which served, is told to stop.
  before = registry_->with_tgt_qp(*record, [&](TgtQpRecord& r) { return registry_->serve_tgt_locked(r, proc_, 2); });
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(before->qp_id, 1u);
  EXPECT_EQ(registry_->tgt_server(qpn)->qp_id, 2u);
  // The server closes: handle 1 is named to take over.
  TgtHandle next{};
  EXPECT_FALSE(registry_->close_tgt_qp(qpn, proc_, 2, &next));
  EXPECT_EQ(next.qp_id, 1u);
  EXPECT_EQ(next.pid, pid());
  EXPECT_EQ(registry_->tgt_server(qpn)->qp_id, 1u);
  // A handle that does not serve closes: nobody is named.
  ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 3).has_value());
  next = TgtHandle{};
  EXPECT_FALSE(registry_->close_tgt_qp(qpn, proc_, 3, &next));
  EXPECT_EQ(next.pid, 0u);
  EXPECT_TRUE(registry_->close_tgt_qp(qpn, proc_, 1));
}

TEST_F(TgtQpTest, DeadHandlesNeitherServeNorKeepTheQp) {
  const uint32_t qpn = make_tgt();
  TgtQpRecord* record = registry_->tgt_qp(qpn);
  ASSERT_NE(record, nullptr);
  uint32_t dead_pid = 0;
  const uint32_t dead = dead_process(dead_pid);
  ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, dead, dead_pid, 4).has_value());
  registry_->with_tgt_qp(*record, [&](TgtQpRecord& r) { return registry_->serve_tgt_locked(r, dead, 4); });
  ASSERT_EQ(registry_->tgt_server(qpn)->pid, dead_pid);
  // A packet nobody took: the live handle is elected, once.
  auto elected = registry_->elect_tgt_server(qpn);
  ASSERT_TRUE(elected.has_value());
  EXPECT_EQ(elected->pid, pid());
  EXPECT_EQ(elected->qp_id, 1u);
  EXPECT_FALSE(registry_->elect_tgt_server(qpn).has_value());  // a live one serves now
  TgtHandle holders[kMaxTgtHolders];
  EXPECT_EQ(registry_->tgt_holders(*record, holders), 1u);  // the dead handle went with the election
  // Dead again, and the live handle closes: the dead one keeps nothing.
  ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, dead, dead_pid, 5).has_value());
  EXPECT_TRUE(registry_->close_tgt_qp(qpn, proc_, 1));
  EXPECT_EQ(registry_->find_qp(qpn), nullptr);
}

// A handle left by a process that died in our registry slot with our pid
// (pids come round): not ours, and dead -- it neither serves nor survives
// an election, though its slot and pid name a live process.
TEST_F(TgtQpTest, AHandleOfAnEarlierProcessWithOurSlotAndPidIsDead) {
  const uint32_t qpn = make_tgt();
  TgtQpRecord* record = registry_->tgt_qp(qpn);
  ASSERT_NE(record, nullptr);
  ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 7).has_value());
  bool aged = false;
  for (TgtHolder& h : record->holders) {
    if (h.proc_plus1.load() != proc_ + 1 || h.qp_id.load() != 7) continue;
    ASSERT_EQ(h.start_time.load(), registry_->identity_of(proc_).start_time);
    h.start_time.store(h.start_time.load() - 1);  // as if an earlier process had opened it
    aged = true;
  }
  ASSERT_TRUE(aged);
  registry_->with_tgt_qp(*record, [&](TgtQpRecord& r) { return registry_->serve_tgt_locked(r, proc_, 7); });
  ASSERT_EQ(registry_->tgt_server(qpn)->qp_id, 7u);
  auto elected = registry_->elect_tgt_server(qpn);
  ASSERT_TRUE(elected.has_value()) << "the earlier process's handle was taken for a live one";
  EXPECT_EQ(elected->qp_id, 1u);
  TgtHandle holders[kMaxTgtHolders];
  EXPECT_EQ(registry_->tgt_holders(*record, holders), 1u);
  EXPECT_TRUE(registry_->close_tgt_qp(qpn, proc_, 1));
}

TEST_F(TgtQpTest, ADeadProcessesLastHandleIsReclaimedWithIt) {
  uint32_t dead_pid = 0;
  const uint32_t dead = dead_process(dead_pid);
  auto made = registry_->create_tgt_qp(dead, dead_pid, 1);
  ASSERT_TRUE(made.has_value());
  registry_->publish_qp(made->qpn);
  const uint32_t kept = make_tgt();
  ASSERT_TRUE(registry_->open_tgt_qp(kept, kDomain, dead, dead_pid, 2).has_value());
  // The next registration sweeps the dead: its QP goes, the shared one stays.
  ASSERT_TRUE(registry_->register_process(pid(), 4).has_value());
  EXPECT_EQ(registry_->find_qp(made->qpn), nullptr);
  TgtQpRecord* record = registry_->tgt_qp(kept);
  ASSERT_NE(record, nullptr);
  TgtHandle holders[kMaxTgtHolders];
  EXPECT_EQ(registry_->tgt_holders(*record, holders), 1u);
  EXPECT_TRUE(registry_->close_tgt_qp(kept, proc_, 1));
}

TEST_F(TgtQpTest, TheTableHoldsMaxTgtQpsAndHandles) {
  std::vector<uint32_t> qpns;
  for (uint32_t i = 0; i < kMaxTgtQps; ++i) {
    auto made = registry_->create_tgt_qp(proc_, pid(), i + 1);
    ASSERT_TRUE(made.has_value()) << i;
    qpns.push_back(made->qpn);
  }
  EXPECT_EQ(registry_->create_tgt_qp(proc_, pid(), 0).error(), std::errc::not_enough_memory);
  for (uint32_t i = 0; i < kMaxTgtQps; ++i) EXPECT_TRUE(registry_->close_tgt_qp(qpns[i], proc_, i + 1));
  const uint32_t qpn = make_tgt();
  for (uint32_t i = 1; i < kMaxTgtHolders; ++i)
    ASSERT_TRUE(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 100 + i).has_value()) << i;
  EXPECT_EQ(registry_->open_tgt_qp(qpn, kDomain, proc_, pid(), 999).error(), std::errc::not_enough_memory);
}

TEST_F(HostRegistryTest, ANestedAccessTakesASharedSlot) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
  const uint32_t target = proc_ + 1;
  std::thread([&] {
    const uint32_t outer = registry_->begin_access(proc_, target);
    const uint32_t inner = registry_->try_begin_access(proc_, target + 1);
    EXPECT_LT(outer, kOwnedAccessSlots) << "the thread's own slot first";
    EXPECT_GE(inner, kOwnedAccessSlots) << "a second process while inside the first: a shared slot";
    EXPECT_LT(inner, kAccessSlotsPerProc);
    registry_->end_access(proc_, inner);
    registry_->end_access(proc_, outer);
    EXPECT_EQ(registry_->begin_access(proc_, target), outer) << "the own slot again once it is free";
    registry_->end_access(proc_, outer);
  }).join();
}

// The fence must wait for an access announced by a plain store in another
// thread: it returns only after the accessor has left.
TEST_F(HostRegistryTest, TheFenceWaitsForAnOwnedAnnouncement) {
  if (!testing::owned_access_slots_here()) GTEST_SKIP() << "membarrier(REGISTER_GLOBAL_EXPEDITED) refused here";
  const uint32_t target = proc_ + 1;
  std::atomic<bool> announced{false}, fencing{false}, left{false};
  std::thread accessor([&] {
    const uint32_t slot = registry_->begin_access(proc_, target);
    EXPECT_LT(slot, kOwnedAccessSlots);
    announced = true;
    while (!fencing.load()) std::this_thread::yield();
    for (int i = 0; i < 1000; ++i) std::this_thread::yield();  // the fence is under way by now, or soon
    left = true;
    registry_->end_access(proc_, slot);
  });
  while (!announced.load()) std::this_thread::yield();
  fencing = true;
  registry_->fence_accesses(target);
  EXPECT_TRUE(left.load()) << "the fence returned while the access was under way";
  accessor.join();
}

}  // namespace
}  // namespace softhca::host
