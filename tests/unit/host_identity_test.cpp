// host::host_key / host_directory_in: a host is a network namespace, and its
// files live in a private directory of their own.
#include "host/host_identity.hpp"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace softhca::host {
namespace {

TEST(HostIdentity, TheKeyNamesThisProcesssNetworkNamespace) {
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self/ns/net", &st), 0);
  EXPECT_EQ(host_key(), "net-" + std::to_string(static_cast<unsigned long long>(st.st_ino)));
  EXPECT_EQ(host_key(), host_key()) << "stable within a process";
}

class HostDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_ = "/dev/shm/softhca-unit-hostdir-" + std::to_string(::getpid()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(::mkdir(runtime_.c_str(), 0700), 0);
  }
  void TearDown() override {
    ::rmdir((runtime_ + "/net-1").c_str());
    ::rmdir((runtime_ + "/net-2").c_str());
    ::unlink((runtime_ + "/net-3").c_str());
    ::rmdir(runtime_.c_str());
  }
  static mode_t mode_of(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
  }
  std::string runtime_;
};

TEST_F(HostDirectory, EachHostGetsItsOwnPrivateDirectory) {
  auto one = host_directory_in(runtime_, "net-1");
  auto two = host_directory_in(runtime_, "net-2");
  ASSERT_TRUE(one.has_value());
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(*one, runtime_ + "/net-1");
  EXPECT_NE(*one, *two);
  EXPECT_TRUE(S_ISDIR(mode_of(*one)));
  EXPECT_EQ(mode_of(*one) & 07777, 0700u);
  // Asked again (another process of the same host): the same directory.
  EXPECT_EQ(host_directory_in(runtime_, "net-1").value_or(""), *one);
}

TEST_F(HostDirectory, ANameThatIsNotAPrivateDirectoryIsRefused) {
  const std::string squat = runtime_ + "/net-3";
  const int fd = ::open(squat.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_FALSE(host_directory_in(runtime_, "net-3").has_value());
}

}  // namespace
}  // namespace softhca::host
