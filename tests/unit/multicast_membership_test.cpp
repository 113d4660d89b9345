// Which interfaces a UD QP's multicast group is joined on, and that the
// network membership follows the attachments: joined with the first QP of
// the process on an interface, left with the last, whether it detaches or
// is destroyed.
#include "engine/multicast_membership.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace softhca::engine {
namespace {

GidEntry v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint32_t ifindex) {
  const uint8_t ip[4] = {a, b, c, d};
  return GidEntry{ipv4_mapped_gid(ip), GidType::kRoceV2, ifindex, "if" + std::to_string(ifindex)};
}

GidEntry v6(GidBytes raw, uint32_t ifindex) { return GidEntry{raw, GidType::kRoceV2, ifindex, "if" + std::to_string(ifindex)}; }

constexpr GidBytes kGroup4 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1};
constexpr GidBytes kGroup6 = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
constexpr GidBytes kGlobal6 = {0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

// lo (1) with 127.0.0.1 and ::1, eth0 (2) with IPv4 and IPv6, eth1 (3) with IPv4 only.
std::vector<GidEntry> machine() {
  return {v4(127, 0, 0, 1, 1), v6(kLoopbackV6Gid, 1), v4(198, 18, 0, 1, 2), v6(kGlobal6, 2), v4(198, 18, 1, 1, 3)};
}

TEST(GroupInterfaces, EveryInterfaceOfTheGroupsIpVersionButLoopback) {
  const auto gids = machine();
  EXPECT_EQ(group_interfaces(gids, kGroup4.data()), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(group_interfaces(gids, kGroup6.data()), (std::vector<uint32_t>{2}));
}

TEST(GroupInterfaces, TheNamedInterfaceOnlyWhenItCanReachAnotherHost) {
  const auto gids = machine();
  EXPECT_EQ(group_interfaces(gids, kGroup4.data(), 3), (std::vector<uint32_t>{3}));
  EXPECT_TRUE(group_interfaces(gids, kGroup4.data(), 1).empty()) << "loopback reaches no other host";
  EXPECT_TRUE(group_interfaces(gids, kGroup6.data(), 3).empty()) << "eth1 has no IPv6 address";
  EXPECT_TRUE(group_interfaces(gids, kGroup4.data(), 9).empty()) << "no such interface";
}

TEST(GroupInterfaces, NoneOnAHostOfLoopbackAlone) {
  const std::vector<GidEntry> gids{v4(127, 0, 0, 1, 1), v6(kLoopbackV6Gid, 1)};
  EXPECT_TRUE(group_interfaces(gids, kGroup4.data()).empty());
  EXPECT_TRUE(group_interfaces(gids, kGroup6.data()).empty());
}

// A link that records the joins and leaves it is asked for.
class RecordingLink final : public link::Link {
 public:
  std::unique_ptr<link::Channel> open_channel(const link::ChannelConfig&) override { return nullptr; }
  void send_datagram(const link::Datagram&, const transport::Request&) override {}
  void join_group(const uint8_t* mgid, uint32_t ifindex) override { ++joins[key(mgid, ifindex)]; }
  void leave_group(const uint8_t* mgid, uint32_t ifindex) override { ++leaves[key(mgid, ifindex)]; }
  using Key = std::pair<GidBytes, uint32_t>;
  static Key key(const uint8_t* mgid, uint32_t ifindex) {
    Key k{{}, ifindex};
    std::copy(mgid, mgid + 16, k.first.begin());
    return k;
  }
  std::map<Key, int> joins, leaves;
};

TEST(MulticastMembership, JoinsOncePerQpAndLeavesOnDetach) {
  RecordingLink link;
  MulticastMembership m(link);
  const uint32_t both[] = {2, 3};
  m.add(kGroup4.data(), 0x11, both);
  m.add(kGroup4.data(), 0x11, both);  // attached twice: nothing more
  EXPECT_EQ((link.joins[{kGroup4, 2}]), 1);
  EXPECT_EQ((link.joins[{kGroup4, 3}]), 1);
  m.remove(kGroup6.data(), 0x11);  // another group: nothing
  EXPECT_TRUE(link.leaves.empty());
  m.remove(kGroup4.data(), 0x11);
  EXPECT_EQ((link.leaves[{kGroup4, 2}]), 1);
  EXPECT_EQ((link.leaves[{kGroup4, 3}]), 1);
  m.remove(kGroup4.data(), 0x11);  // detached already: nothing left to leave
  EXPECT_EQ((link.leaves[{kGroup4, 2}]), 1);
}

TEST(MulticastMembership, EachQpJoinsAndLeavesForItselfTheLinkCounts) {
  RecordingLink link;
  MulticastMembership m(link);
  const uint32_t eth0[] = {2};
  m.add(kGroup4.data(), 0x11, eth0);
  m.add(kGroup4.data(), 0x12, eth0);
  EXPECT_EQ((link.joins[{kGroup4, 2}]), 2);
  m.remove(kGroup4.data(), 0x11);
  EXPECT_EQ((link.leaves[{kGroup4, 2}]), 1);
}

TEST(MulticastMembership, ADestroyedQpLeavesEveryGroupItWasIn) {
  RecordingLink link;
  MulticastMembership m(link);
  const uint32_t eth0[] = {2};
  m.add(kGroup4.data(), 0x11, eth0);
  m.add(kGroup6.data(), 0x11, eth0);
  m.add(kGroup6.data(), 0x12, eth0);
  m.remove_qp(0x11);
  EXPECT_EQ((link.leaves[{kGroup4, 2}]), 1);
  EXPECT_EQ((link.leaves[{kGroup6, 2}]), 1);
  m.remove_qp(0x12);
  EXPECT_EQ((link.leaves[{kGroup4, 2}]), 1);
  EXPECT_EQ((link.leaves[{kGroup6, 2}]), 2);
}

}  // namespace
}  // namespace softhca::engine
