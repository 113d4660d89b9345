// rdma_resolve_addr to another host's address, through the C API, inside a
// network namespace of the test's own: lo, and a veth pair whose one end
// (198.18.7.1/24) leads to an end with no address, where nobody answers
// ARP. So a destination on that subnet never gets a valid neighbour entry
// (ADDR_ERROR -ETIMEDOUT), one with a permanent entry resolves at once, and
// nothing the test makes softhca send can leave the namespace. In the abi
// label, so that the sanitizer builds run the CM thread's neighbour checks
// against destroys. Skipped without root (no namespace, no veth).
#include <arpa/inet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "cm_test_support.hpp"

using namespace cm_test;

namespace {

// Before main (and any thread): a network namespace with lo up.
bool enter_private_network() {
  if (::geteuid() != 0 || ::unshare(CLONE_NEWNET) != 0) return false;
  return std::system("ip link set lo up") == 0;
}
const bool kPrivateNetwork = enter_private_network();

class CmResolution : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kPrivateNetwork) return;
    network_ok_ = std::system(
                      "ip link add shres0 type veth peer name shres1 && ip addr add 198.18.7.1/24 dev shres0 && "
                      "ip link set shres0 up && ip link set shres1 up && "
                      "ip neigh add 198.18.7.8 lladdr 02:00:00:00:07:08 dev shres0 nud permanent") == 0;
  }
  void SetUp() override {
    if (!kPrivateNetwork) GTEST_SKIP() << "needs root for a network namespace of its own";
    ASSERT_TRUE(network_ok_) << "could not make the veth pair (ip link add ... type veth)";
    ch_ = rdma_create_event_channel();
    ASSERT_NE(ch_, nullptr);
  }
  void TearDown() override {
    if (ch_ != nullptr) rdma_destroy_event_channel(ch_);
  }
  static sockaddr_in on_subnet(uint8_t host) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(7471);
    sin.sin_addr.s_addr = htonl(0xC6120700u | host);  // 198.18.7.host
    return sin;
  }
  static inline bool network_ok_ = false;
  rdma_event_channel* ch_ = nullptr;
};

TEST_F(CmResolution, ANeighbourThatNeverAnswersIsAddrErrorTimedOutAfterTheTimeout) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = on_subnet(9);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 300), 0);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 300), -1) << "a resolution is under way";
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_ADDR_ERROR);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->status, -ETIMEDOUT);
  EXPECT_GE(took, std::chrono::milliseconds(300)) << "given up before the caller's timeout";
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(CmResolution, AValidNeighbourResolvesFromTheInterfacesAddress) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = on_subnet(8);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->status, 0);
  rdma_ack_cm_event(ev);
  const auto* src = reinterpret_cast<const sockaddr_in*>(rdma_get_local_addr(id));
  EXPECT_EQ(src->sin_addr.s_addr, htonl(0xC6120701u)) << "the source is the veth's 198.18.7.1";
  // The path MTU is the veth's (1500 bytes: 1024).
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ev = expect_event(ch_, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(id->route.path_rec->mtu, IBV_MTU_1024);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(CmResolution, IdsDestroyedWhileTheirResolutionWaitsGetNoEvent) {
  // Many ids wait on the CM thread's neighbour checks; half are destroyed at
  // once, the rest time out: only those report, each once.
  constexpr int kIds = 16;
  rdma_cm_id* ids[kIds] = {};
  for (int i = 0; i < kIds; ++i) {
    ASSERT_EQ(rdma_create_id(ch_, &ids[i], nullptr, RDMA_PS_TCP), 0);
    sockaddr_in dst = on_subnet(static_cast<uint8_t>(20 + i));
    ASSERT_EQ(rdma_resolve_addr(ids[i], nullptr, sa(dst), 200), 0);
  }
  for (int i = 0; i < kIds; i += 2) EXPECT_EQ(rdma_destroy_id(ids[i]), 0);
  for (int n = 0; n < kIds / 2; ++n) {
    rdma_cm_event* ev = expect_event(ch_, RDMA_CM_EVENT_ADDR_ERROR);
    ASSERT_NE(ev, nullptr);
    bool live = false;
    for (int i = 1; i < kIds; i += 2) live |= ev->id == ids[i];
    EXPECT_TRUE(live) << "an event for a destroyed id";
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(wait_event(ch_, 300), nullptr) << "one event per waiting id, no more";
  for (int i = 1; i < kIds; i += 2) EXPECT_EQ(rdma_destroy_id(ids[i]), 0);
}

}  // namespace
