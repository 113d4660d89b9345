// host::runtime_directory_for: the private directory that holds a user's
// registry, port table and CM sockets, and the fallback past names another
// user (or an accident) has taken. Every test works under a private prefix in
// /dev/shm, never the real per-user names, and removes what it made.
#include "host/runtime_dir.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "cm/port_table.hpp"
#include "cm/local_transport.hpp"
#include "host/host_registry.hpp"

namespace softhca::host {
namespace {

class RuntimeDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = "/dev/shm/softhca-unit-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    for (int n = 0; n < kRuntimeDirCandidates; ++n) remove(candidate(n));
  }
  std::string candidate(int n) const { return n == 0 ? prefix_ : prefix_ + "." + std::to_string(n); }
  // Removes a squat or a directory the test made (empty by then), whatever it is.
  static void remove(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
      ::chmod(path.c_str(), 0700);
      ::rmdir(path.c_str());
    } else {
      ::unlink(path.c_str());
    }
  }
  static mode_t mode_of(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
  }
  static bool make_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }
  // The registry, the port table and a CM endpoint all open in `dir`.
  static void expect_everything_opens(const std::string& dir) {
    auto registry = HostRegistry::open_in(dir, true);
    ASSERT_TRUE(registry.has_value()) << dir;
    delete *registry;
    auto table = cm::PortTable::open_in(dir, true);
    ASSERT_TRUE(table.has_value()) << dir;
    delete *table;
    auto transport = cm::LocalTransport::open(dir + "/cm-" + std::to_string(::getpid()) + ".sock");
    ASSERT_TRUE(transport.has_value()) << dir;
  }

  std::string prefix_;
};

TEST_F(RuntimeDirTest, FirstCandidateIsCreatedPrivate) {
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, prefix_);
  EXPECT_TRUE(S_ISDIR(mode_of(prefix_)));
  EXPECT_EQ(mode_of(prefix_) & 07777, 0700u);
  // Every later process arrives at the same one.
  EXPECT_EQ(runtime_directory_for("", prefix_).value_or(""), prefix_);
  expect_everything_opens(*dir);
}

TEST_F(RuntimeDirTest, RegularFileSquatIsSkipped) {
  ASSERT_TRUE(make_file(prefix_));
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, candidate(1));
  EXPECT_EQ(mode_of(candidate(1)) & 07777, 0700u);
  EXPECT_EQ(runtime_directory_for(nullptr, prefix_).value_or(""), candidate(1));
  expect_everything_opens(*dir);
}

TEST_F(RuntimeDirTest, OpenDirectoryAndSymlinkSquatsAreSkipped) {
  ASSERT_EQ(::mkdir(prefix_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(prefix_.c_str(), 0777), 0);  // anyone could have planted files in it
  ASSERT_EQ(::symlink("/tmp", candidate(1).c_str()), 0);
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, candidate(2));
  expect_everything_opens(*dir);
}

TEST_F(RuntimeDirTest, DirectoryOfAnotherUserIsSkipped) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a directory owned by another uid (65534)";
  ASSERT_EQ(::mkdir(prefix_.c_str(), 0700), 0);
  ASSERT_EQ(::chown(prefix_.c_str(), 65534, 65534), 0);
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, candidate(1));
  expect_everything_opens(*dir);
}

TEST_F(RuntimeDirTest, CandidateInUseWinsOverAnEarlierFreeName) {
  // A squat of the first name made the user's processes use .1; the squatter
  // then removed it. Later processes must still join the others in .1.
  ASSERT_EQ(::mkdir(candidate(1).c_str(), 0700), 0);
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, candidate(1));
  EXPECT_EQ(mode_of(prefix_), 0u);  // not created
}

TEST_F(RuntimeDirTest, AllCandidatesTakenIsPermissionDenied) {
  for (int n = 0; n < kRuntimeDirCandidates; ++n) ASSERT_TRUE(make_file(candidate(n)));
  auto dir = runtime_directory_for(nullptr, prefix_);
  ASSERT_FALSE(dir.has_value());
  EXPECT_EQ(dir.error(), std::errc::permission_denied);
}

TEST_F(RuntimeDirTest, ExplicitDirectoryIsUsedAsItIs) {
  // Created when missing, even with the default names squatted.
  ASSERT_TRUE(make_file(prefix_));
  const std::string mine = candidate(5);
  auto dir = runtime_directory_for(mine.c_str(), prefix_);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, mine);
  EXPECT_EQ(mode_of(mine) & 07777, 0700u);
  expect_everything_opens(*dir);
  // One of ours that is too open is tightened.
  ASSERT_EQ(::chmod(mine.c_str(), 0755), 0);
  EXPECT_EQ(runtime_directory_for(mine.c_str(), prefix_).value_or(""), mine);
  EXPECT_EQ(mode_of(mine) & 07777, 0700u);
}

TEST_F(RuntimeDirTest, UnusableExplicitDirectoryFailsWithoutFallback) {
  ASSERT_TRUE(make_file(prefix_));
  auto dir = runtime_directory_for(prefix_.c_str(), candidate(1));
  ASSERT_FALSE(dir.has_value());
  EXPECT_EQ(dir.error(), std::errc::permission_denied);
  EXPECT_EQ(mode_of(candidate(1)), 0u);
}

// probe_runtime_directory_for (what `softhca info` shows) names the directory
// runtime_directory_for then uses, and creates nothing itself.
TEST_F(RuntimeDirTest, ProbeOfAFreshPrefixCreatesNothing) {
  const RuntimeDirProbe probe = probe_runtime_directory_for(nullptr, prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kCreated);
  EXPECT_EQ(probe.path, prefix_);
  EXPECT_EQ(mode_of(prefix_), 0u);
  EXPECT_EQ(runtime_directory_for(nullptr, prefix_).value_or(""), probe.path);
  const RuntimeDirProbe again = probe_runtime_directory_for(nullptr, prefix_);
  EXPECT_EQ(again.state, RuntimeDirProbe::State::kUsable);
  EXPECT_EQ(again.path, prefix_);
  EXPECT_TRUE(again.detail.empty()) << again.detail;
}

TEST_F(RuntimeDirTest, ProbeFollowsTheFallbackPastSquats) {
  // A file, then an open directory: the next free name is the one used.
  ASSERT_TRUE(make_file(prefix_));
  ASSERT_EQ(::mkdir(candidate(1).c_str(), 0700), 0);
  ASSERT_EQ(::chmod(candidate(1).c_str(), 0777), 0);
  const RuntimeDirProbe probe = probe_runtime_directory_for(nullptr, prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kCreated);
  EXPECT_EQ(probe.path, candidate(2));
  EXPECT_EQ(probe.detail, prefix_ + " is not a directory");  // what runtime_directory_for warns
  EXPECT_EQ(runtime_directory_for(nullptr, prefix_).value_or(""), candidate(2));
}

TEST_F(RuntimeDirTest, ProbePrefersACandidateInUse) {
  ASSERT_EQ(::mkdir(candidate(3).c_str(), 0700), 0);
  const RuntimeDirProbe probe = probe_runtime_directory_for(nullptr, prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUsable);
  EXPECT_EQ(probe.path, candidate(3));
  EXPECT_EQ(probe.detail, prefix_ + " is missing while a later one is in use");
  EXPECT_EQ(runtime_directory_for(nullptr, prefix_).value_or(""), candidate(3));
}

TEST_F(RuntimeDirTest, ProbeWithEveryCandidateTakenIsUnusable) {
  for (int n = 0; n < kRuntimeDirCandidates; ++n) ASSERT_TRUE(make_file(candidate(n)));
  const RuntimeDirProbe probe = probe_runtime_directory_for(nullptr, prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUnusable);
  EXPECT_TRUE(probe.path.empty());
  EXPECT_NE(probe.detail.find(candidate(15) + " is not a directory"), std::string::npos) << probe.detail;
}

TEST_F(RuntimeDirTest, ProbeOfAnExplicitDirectoryChangesNothing) {
  const std::string mine = candidate(7);
  RuntimeDirProbe probe = probe_runtime_directory_for(mine.c_str(), prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kCreated);
  EXPECT_EQ(probe.path, mine);
  EXPECT_EQ(mode_of(mine), 0u);
  // Ours but too open: usable (runtime_directory_for tightens it), not tightened by the probe.
  ASSERT_EQ(::mkdir(mine.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(mine.c_str(), 0755), 0);
  probe = probe_runtime_directory_for(mine.c_str(), prefix_);
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUsable);
  EXPECT_EQ(probe.detail, "its mode is set to 0700 at first use");
  EXPECT_EQ(mode_of(mine) & 07777, 0755u);
}

TEST_F(RuntimeDirTest, ProbeOfAnUnusableExplicitDirectorySaysWhy) {
  ASSERT_TRUE(make_file(prefix_));
  RuntimeDirProbe probe = probe_runtime_directory_for(prefix_.c_str(), candidate(1));
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUnusable);
  EXPECT_EQ(probe.detail, "is not a directory");
  const std::string orphan = prefix_ + "/below-a-file";
  probe = probe_runtime_directory_for(orphan.c_str(), candidate(1));
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUnusable);
  EXPECT_FALSE(runtime_directory_for(orphan.c_str(), candidate(1)).has_value());
  const std::string parentless = candidate(2) + "/sub";  // candidate(2) does not exist
  probe = probe_runtime_directory_for(parentless.c_str(), candidate(1));
  EXPECT_EQ(probe.state, RuntimeDirProbe::State::kUnusable);
  EXPECT_EQ(probe.detail, "cannot be created: its parent directory does not exist");
  EXPECT_FALSE(runtime_directory_for(parentless.c_str(), candidate(1)).has_value());
}

TEST(RuntimeDirProblem, NamesWhatIsWrong) {
  EXPECT_NE(private_dir_problem("/nonexistent-softhca-dir"), nullptr);
  EXPECT_STREQ(private_dir_problem("/proc/self"), "is a symbolic link");
  EXPECT_STREQ(private_dir_problem("/dev/null"), "is not a directory");
}

}  // namespace
}  // namespace softhca::host
