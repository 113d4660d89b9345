// The table a shared context keeps in its file (engine/context_file): who
// opened it and which processes' objects use an exported PD, each process
// named by its whole identity (registry slot, pid, start time), so that a
// later process that got a dead one's slot and, the pids having come round,
// its pid, inherits neither its standing as the creator nor its counts.
#include "engine/context_file.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

namespace softhca::engine {
namespace {

class ContextFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = ::memfd_create("softhca-unit-context", MFD_CLOEXEC);
    ASSERT_GE(fd_, 0);
    auto file = ContextFile::create(fd_, me_, 77);
    ASSERT_TRUE(file.has_value());
    file_ = *file;
  }
  void TearDown() override {
    delete file_;
    ::close(fd_);
  }
  uint32_t users_elsewhere_alive_if(uint64_t start_time) {
    return file_->users_elsewhere(ExportKind::kPd, 5, kSelf, [&](const host::ProcessIdentity& who) {
      return who.start_time == start_time;
    });
  }

  static constexpr uint32_t kSelf = 9;  // the asking process's slot
  const host::ProcessIdentity me_{3, 4242, 1000};
  const host::ProcessIdentity earlier_{3, 4242, 999};  // our slot and pid, started before us
  int fd_ = -1;
  ContextFile* file_ = nullptr;
};

TEST_F(ContextFileTest, TheCreatorIsKnownByItsWholeIdentity) {
  EXPECT_EQ(file_->creator(), me_);
  auto attached = ContextFile::attach(fd_);
  ASSERT_TRUE(attached.has_value());
  EXPECT_EQ((*attached)->creator(), me_);
  EXPECT_NE((*attached)->creator(), earlier_);
  (*attached)->release();
  delete *attached;
}

TEST_F(ContextFileTest, AnEarlierProcessWithOurSlotAndPidKeepsItsOwnCount) {
  file_->add_users(ExportKind::kPd, 5, earlier_, 1);
  file_->add_users(ExportKind::kPd, 5, me_, 2);
  file_->add_users(ExportKind::kPd, 5, me_, -1);  // ours, not the earlier one's
  EXPECT_EQ(file_->users_elsewhere(ExportKind::kPd, 5, kSelf, [](const host::ProcessIdentity&) { return true; }),
            2u);
  // The earlier process is dead: its user goes, ours stays.
  EXPECT_EQ(users_elsewhere_alive_if(me_.start_time), 1u);
  file_->add_users(ExportKind::kPd, 5, me_, -1);
  EXPECT_EQ(users_elsewhere_alive_if(me_.start_time), 0u);
}

TEST_F(ContextFileTest, UsersInTheAskingSlotAreNotCounted) {
  const host::ProcessIdentity asking{kSelf, 1, 1};
  file_->add_users(ExportKind::kPd, 5, asking, 1);
  EXPECT_EQ(file_->users_elsewhere(ExportKind::kPd, 5, kSelf, [](const host::ProcessIdentity&) { return true; }),
            0u);
}

}  // namespace
}  // namespace softhca::engine
