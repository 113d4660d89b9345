// The udp link's thread with SOFTHCA_UDP_SPIN_US set (ctest: udp.spin, in a
// network namespace, SOFTHCA_LINK=udp): while packets flow it polls its
// sockets instead of sleeping, and application threads leave the sockets to
// it. Traffic must arrive intact and in order in that mode, and once traffic
// stops the thread must go back to sleep: an idle process takes no CPU.
#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "loopback.hpp"

namespace {

using namespace loopback;

// The tid of this process's thread named `name`, or 0.
pid_t thread_named(const std::string& name) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  pid_t found = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string line;
    if (std::getline(comm, line) && line == name) {
      found = static_cast<pid_t>(std::atoi(entry->d_name));
      break;
    }
  }
  closedir(dir);
  return found;
}

// The CPU time thread `tid` has used, in clock ticks (utime + stime), or -1.
long cpu_ticks(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return -1;
  // Fields after the command, which is in parentheses and may hold spaces.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long utime = -1, stime = -1;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atol(field.c_str());
    if (i == 15) stime = std::atol(field.c_str());
  }
  return utime < 0 || stime < 0 ? -1 : utime + stime;
}

TEST(UdpSpin, PingPongArrivesInOrderWhileTheThreadSpins) {
  const char* spin = std::getenv("SOFTHCA_UDP_SPIN_US");
  ASSERT_TRUE(spin != nullptr && std::atoi(spin) > 0) << "run with SOFTHCA_UDP_SPIN_US set (ctest udp.spin)";
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  // One message at a time, each waited for: every packet finds the link's
  // thread spinning from the one before (2 ms under ctest).
  constexpr int kRounds = 300;
  constexpr uint32_t kSize = 3000;  // three packets at the loopback MTU of 1024 and more
  Buffer src(dev.pd, kSize);
  Buffer dst(dev.pd, kSize);
  for (int i = 0; i < kRounds; ++i) {
    fill_pattern({src.data(), src.size()}, static_cast<uint64_t>(i));
    ibv_sge rsge = dst.sge(0, kSize);
    ASSERT_EQ(post_recv(pair.b, static_cast<uint64_t>(i), &rsge, 1), 0);
    ibv_sge ssge = src.sge(0, kSize);
    ibv_send_wr wr = make_wr(static_cast<uint64_t>(i), IBV_WR_SEND, &ssge, 1);
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
    auto got = poll_n(pair.b_recv_cq, 1);
    auto sent = poll_n(pair.a_send_cq, 1);
    ASSERT_EQ(got.size(), 1u) << "round " << i;
    ASSERT_EQ(sent.size(), 1u) << "round " << i;
    ASSERT_EQ(got[0].status, IBV_WC_SUCCESS) << "round " << i;
    ASSERT_EQ(got[0].wr_id, static_cast<uint64_t>(i));
    ASSERT_EQ(got[0].byte_len, kSize);
    ASSERT_EQ(sent[0].status, IBV_WC_SUCCESS) << "round " << i;
    ASSERT_EQ(first_mismatch({src.data(), kSize}, {dst.data(), kSize}), -1) << "round " << i;
  }
}

TEST(UdpSpin, TheThreadSleepsOnceTrafficStops) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  Buffer src(dev.pd, 4096);
  Buffer dst(dev.pd, 4096);
  fill_pattern({src.data(), src.size()}, 5);
  for (int i = 0; i < 50; ++i) {
    ibv_sge sge = src.sge(0, 4096);
    ibv_send_wr wr = make_wr(static_cast<uint64_t>(i), IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a, &wr, &bad), 0);
    auto sent = poll_n(pair.a_send_cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    ASSERT_EQ(sent[0].status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(first_mismatch({src.data(), 4096}, {dst.data(), 4096}), -1);
  const pid_t link_thread = thread_named("softhca-udp");
  ASSERT_NE(link_thread, 0) << "no udp link thread: is SOFTHCA_LINK=udp set?";
  // Over half a second a thread that kept polling takes about 50 ticks; one
  // that sleeps takes at most the rest of its 2 ms spin after the last
  // packet (one tick) and a timer of a QP waking it briefly.
  const long before = cpu_ticks(link_thread);
  std::this_thread::sleep_for(Millis(500));
  const long after = cpu_ticks(link_thread);
  ASSERT_GE(before, 0);
  ASSERT_GE(after, before);
  EXPECT_LE(after - before, 5) << "the udp link's thread kept running with no traffic";
}

}  // namespace
