// The shm link's view of a target QP's owner (link/shm/target.hpp):
// owner_gone tells the very process that owned the QP from a later one in
// its registry slot -- another pid, or, after the pids came round, the same
// pid started at another time -- so that a dead peer's requester ends in
// RETRY_EXC_ERR instead of taking the newcomer for its peer (RNR forever,
// or a spurious REM_ACCESS_ERR).
#include "link/shm/target.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "host/host_registry.hpp"

namespace softhca::shm {
namespace {

class ShmTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/softhca-unit-target-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto registry = host::HostRegistry::open_named(dir_ + "/registry", true);
    ASSERT_TRUE(registry.has_value());
    registry_ = *registry;
    auto proc = registry_->register_process(static_cast<uint32_t>(::getpid()), 3);
    ASSERT_TRUE(proc.has_value());
    owner_ = *proc;
  }
  void TearDown() override {
    delete registry_;
    ::rmdir(dir_.c_str());
  }
  // A target owned by `who`, as resolve() would have filled it.
  static TargetQp owned_by(const host::ProcessIdentity& who) {
    TargetQp target;
    target.proc = who.proc;
    target.pid = who.pid;
    target.start_time = who.start_time;
    return target;
  }

  std::string dir_;
  host::HostRegistry* registry_ = nullptr;
  uint32_t owner_ = 0;
  // The initiator: any other slot (owner_gone never calls our own QPs gone).
  uint32_t self() const { return owner_ + 1; }
};

TEST_F(ShmTargetTest, AnOwnerThatRunsIsNotGone) {
  const host::ProcessIdentity owner = registry_->identity_of(owner_);
  ASSERT_NE(owner.pid, 0u);
  ASSERT_NE(owner.start_time, 0u);
  EXPECT_FALSE(owner_gone(*registry_, owned_by(owner), self()));
}

TEST_F(ShmTargetTest, AnotherPidInTheOwnersSlotIsNotTheOwner) {
  host::ProcessIdentity earlier = registry_->identity_of(owner_);
  earlier.pid += 1;
  EXPECT_TRUE(owner_gone(*registry_, owned_by(earlier), self()));
}

// The case a pid alone missed: the owner died, and a process that got its
// slot also got its pid (pids come round within minutes on a busy host).
TEST_F(ShmTargetTest, TheOwnersPidStartedAtAnotherTimeIsNotTheOwner) {
  host::ProcessIdentity earlier = registry_->identity_of(owner_);
  earlier.start_time -= 1;
  EXPECT_TRUE(owner_gone(*registry_, owned_by(earlier), self()));
}

TEST_F(ShmTargetTest, OurOwnQpsAndTheHostsAreNeverGone) {
  host::ProcessIdentity earlier = registry_->identity_of(owner_);
  earlier.start_time -= 1;
  EXPECT_FALSE(owner_gone(*registry_, owned_by(earlier), owner_)) << "our own process";
  TargetQp tgt;
  tgt.proc = host::kHostOwned;
  EXPECT_FALSE(owner_gone(*registry_, tgt, self())) << "a TGT QP is the host's";
}

}  // namespace
}  // namespace softhca::shm
