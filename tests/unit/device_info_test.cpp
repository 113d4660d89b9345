// The GID table builder and DeviceInfo lookups, fed synthetic interface lists.
#include "engine/device/device_info.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <string>
#include <vector>

namespace softhca::engine {
namespace {

InterfaceAddress v4(const char* text, uint32_t ifindex, const char* ifname) {
  InterfaceAddress a;
  a.family = AF_INET;
  EXPECT_EQ(inet_pton(AF_INET, text, a.address.data()), 1) << text;
  a.ifindex = ifindex;
  a.ifname = ifname;
  return a;
}

InterfaceAddress v6(const char* text, uint32_t ifindex, const char* ifname) {
  InterfaceAddress a;
  a.family = AF_INET6;
  EXPECT_EQ(inet_pton(AF_INET6, text, a.address.data()), 1) << text;
  a.ifindex = ifindex;
  a.ifname = ifname;
  return a;
}

GidBytes gid_of(const char* ipv6_text) {
  GidBytes raw{};
  EXPECT_EQ(inet_pton(AF_INET6, ipv6_text, raw.data()), 1) << ipv6_text;
  return raw;
}

std::vector<GidBytes> raws(const std::vector<GidEntry>& table) {
  std::vector<GidBytes> out;
  for (const GidEntry& e : table) out.push_back(e.raw);
  return out;
}

TEST(GidTable, Ipv4MappedFormat) {
  const uint8_t addr[4] = {192, 0, 2, 7};
  const GidBytes raw = ipv4_mapped_gid(addr);
  const GidBytes expected = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7};
  EXPECT_EQ(raw, expected);
  EXPECT_EQ(kLoopbackV4Gid, gid_of("::ffff:127.0.0.1"));
  EXPECT_EQ(kLoopbackV6Gid, gid_of("::1"));
}

TEST(GidTable, TypicalHostOrder) {
  // getifaddrs order: per family, interfaces in index order, but mixed up here on purpose.
  const std::vector<InterfaceAddress> addrs = {
      v6("fe80::fc:ff:fe00:1", 3, "eth0"), v4("192.0.2.2", 3, "eth0"), v6("fd00::2", 3, "eth0"),
      v6("::1", 1, "lo"),                  v4("10.1.0.5", 2, "eth1"),  v4("127.0.0.1", 1, "lo"),
  };
  const std::vector<GidEntry> table = build_gid_table(addrs);
  // The interfaces' IPv4 first (what UCX picks: the first RoCE v2 IPv4
  // GID), their IPv6, and the loopback addresses, which no NIC has, last.
  const std::vector<GidBytes> expected = {
      gid_of("::ffff:10.1.0.5"), gid_of("::ffff:192.0.2.2"), gid_of("fe80::fc:ff:fe00:1"),
      gid_of("fd00::2"),         gid_of("::ffff:127.0.0.1"), gid_of("::1"),
  };
  EXPECT_EQ(raws(table), expected);
  for (const GidEntry& e : table) EXPECT_EQ(e.type, GidType::kRoceV2);
  EXPECT_EQ(table[0].ifname, "eth1");
  EXPECT_EQ(table[0].ifindex, 2u);
  EXPECT_EQ(table[3].ifname, "eth0");
  EXPECT_EQ(table[3].ifindex, 3u);
  EXPECT_EQ(table[4].ifname, "lo");
  EXPECT_EQ(table[4].ifindex, 1u);
}

TEST(GidTable, LoopbackV4AddressesAfterOtherIpv4) {
  const std::vector<InterfaceAddress> addrs = {
      v4("192.0.2.2", 2, "eth0"),
      v4("127.0.0.2", 1, "lo"),
      v4("127.0.0.1", 1, "lo"),
  };
  const std::vector<GidEntry> table = build_gid_table(addrs);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0].raw, gid_of("::ffff:192.0.2.2"));
  EXPECT_EQ(table[1].raw, gid_of("::ffff:127.0.0.1"));
  EXPECT_EQ(table[2].raw, gid_of("::ffff:127.0.0.2"));
}

TEST(GidTable, KeepsKernelOrderWithinAnInterface) {
  const std::vector<InterfaceAddress> addrs = {
      v4("198.18.0.9", 4, "veth0"),
      v4("198.18.0.1", 4, "veth0"),
      v4("127.0.0.1", 1, "lo"),
  };
  const std::vector<GidEntry> table = build_gid_table(addrs);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0].raw, gid_of("::ffff:198.18.0.9"));
  EXPECT_EQ(table[1].raw, gid_of("::ffff:198.18.0.1"));
}

TEST(GidTable, LocalhostAlwaysThereAndIndexZeroWhenAlone) {
  // A namespace whose lo is down: no 127.0.0.1 in getifaddrs.
  const std::vector<GidEntry> table = build_gid_table(std::vector<InterfaceAddress>{v4("198.18.0.1", 5, "veth1")});
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].raw, gid_of("::ffff:198.18.0.1"));
  EXPECT_EQ(table[1].raw, kLoopbackV4Gid);
  EXPECT_EQ(table[1].ifname, "lo");

  const std::vector<GidEntry> empty = build_gid_table(std::vector<InterfaceAddress>{});
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].raw, kLoopbackV4Gid);
  EXPECT_EQ(empty[0].type, GidType::kRoceV2);
}

TEST(GidTable, SynthesizedLocalhostTakesLoIfindex) {
  const std::vector<GidEntry> table = build_gid_table(std::vector<InterfaceAddress>{v6("::1", 1, "lo")});
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].raw, kLoopbackV4Gid);
  EXPECT_EQ(table[0].ifindex, 1u);
  EXPECT_EQ(table[1].raw, kLoopbackV6Gid);
}

TEST(GidTable, DropsDuplicatesAndNonAddresses) {
  InterfaceAddress packet;  // AF_PACKET and friends are no GIDs
  packet.family = AF_PACKET;
  packet.ifindex = 2;
  packet.ifname = "eth0";
  const std::vector<InterfaceAddress> addrs = {
      v4("127.0.0.1", 1, "lo"),   v4("10.0.0.1", 2, "eth0"),   v4("10.0.0.1", 3, "eth1"),
      v4("0.0.0.0", 2, "eth0"),   v6("::", 2, "eth0"),         v6("::ffff:10.0.0.1", 2, "eth0"),
      v6("2001:db8::1", 2, "eth0"), packet,
  };
  const std::vector<GidEntry> table = build_gid_table(addrs);
  const std::vector<GidBytes> expected = {gid_of("::ffff:10.0.0.1"), gid_of("2001:db8::1"),
                                          gid_of("::ffff:127.0.0.1")};
  EXPECT_EQ(raws(table), expected);
  EXPECT_EQ(table[0].ifname, "eth0");  // the lower ifindex wins
}

TEST(GidTable, CutAtTheTableLength) {
  std::vector<InterfaceAddress> addrs;
  for (int i = 0; i < 40; ++i) addrs.push_back(v4(("10.0.0." + std::to_string(i + 1)).c_str(), 2, "eth0"));
  addrs.push_back(v6("::1", 1, "lo"));
  addrs.push_back(v4("127.0.0.1", 1, "lo"));
  const std::vector<GidEntry> table = build_gid_table(addrs);
  ASSERT_EQ(table.size(), static_cast<std::size_t>(limits::kGidTableLen));
  EXPECT_EQ(table.front().raw, gid_of("::ffff:10.0.0.1"));
  // 127.0.0.1 keeps the last entry (rdma_cm on 127.0.0.1 needs it); ::1 did not fit.
  EXPECT_EQ(table[table.size() - 2].raw, gid_of("::ffff:10.0.0.31"));
  EXPECT_EQ(table.back().raw, kLoopbackV4Gid);

  EXPECT_EQ(build_gid_table(addrs, 3).size(), 3u);
}

TEST(DeviceInfo, Lookups) {
  const std::vector<InterfaceAddress> addrs = {v4("127.0.0.1", 1, "lo"), v4("192.0.2.2", 2, "eth0"),
                                               v6("::1", 1, "lo")};
  const DeviceInfo info = make_device_info(addrs, "machine-a");
  EXPECT_EQ(info.name, "softhca0");
  ASSERT_EQ(info.gids.size(), 3u);

  EXPECT_EQ(info.find_gid_index(gid_of("::ffff:192.0.2.2")), 0u);
  EXPECT_EQ(info.find_gid_index(gid_of("::ffff:127.0.0.1")), 1u);
  EXPECT_EQ(info.find_gid_index(gid_of("::1")), 2u);
  EXPECT_FALSE(info.find_gid_index(gid_of("::ffff:192.0.2.3")).has_value());
  EXPECT_FALSE(info.find_gid_index(GidBytes{}).has_value());  // the zero GID is never local

  EXPECT_TRUE(info.is_local_gid(gid_of("::ffff:192.0.2.2")));
  EXPECT_FALSE(info.is_local_gid(gid_of("2001:db8::9")));

  // Raw C arrays (ibv_gid.raw) convert to the span parameter.
  const uint8_t c_raw[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(info.find_gid_index(c_raw), 1u);

  ASSERT_NE(info.gid_at(0), nullptr);
  EXPECT_EQ(info.gid_at(0)->ifname, "eth0");
  EXPECT_EQ(info.gid_at(3), nullptr);
  EXPECT_EQ(info.gid_at(1000), nullptr);
}

TEST(DeviceInfo, NodeGuidIsStableAndNonZero) {
  EXPECT_EQ(derive_node_guid("3d1219c7c4c5404aaa1f6d2a48adfda4"), derive_node_guid("3d1219c7c4c5404aaa1f6d2a48adfda4"));
  EXPECT_NE(derive_node_guid("host-a"), derive_node_guid("host-b"));
  EXPECT_NE(derive_node_guid(""), 0u);
  const DeviceInfo info = make_device_info({}, "seed");
  EXPECT_NE(info.node_guid, 0u);
  EXPECT_EQ(info.sys_image_guid, info.node_guid);
}

TEST(DeviceInfo, ThisHost) {
  const DeviceInfo& info = device_info();
  EXPECT_EQ(&info, &device_info());
  ASSERT_FALSE(info.gids.empty());
  EXPECT_LE(info.gids.size(), static_cast<std::size_t>(limits::kGidTableLen));
  EXPECT_NE(info.node_guid, 0u);
  EXPECT_TRUE(is_local_gid(kLoopbackV4Gid));
  ASSERT_TRUE(find_gid_index(kLoopbackV4Gid).has_value());
  EXPECT_EQ(info.gids[*find_gid_index(kLoopbackV4Gid)].raw, kLoopbackV4Gid);
  // Index 0 is this host's first interface address, or 127.0.0.1 when it has none.
  EXPECT_TRUE(is_local_gid(info.gids[0].raw));
}

}  // namespace
}  // namespace softhca::engine

namespace softhca::engine {
namespace {

InterfaceAddress iface(const char* name, uint32_t mtu, bool loopback, bool up = true) {
  InterfaceAddress a;
  a.family = AF_INET;
  a.ifname = name;
  a.mtu = mtu;
  a.loopback = loopback;
  a.up = up;
  return a;
}

TEST(ActiveMtu, FollowsTheInterfaceMtuAsRoceNicsDo) {
  EXPECT_EQ(roce_mtu_for(1500), 1024u);
  EXPECT_EQ(roce_mtu_for(9000), 4096u);
  EXPECT_EQ(roce_mtu_for(65536), 4096u);
  EXPECT_EQ(roce_mtu_for(4096 + 96), 4096u);
  EXPECT_EQ(roce_mtu_for(4096 + 95), 2048u);
  EXPECT_EQ(roce_mtu_for(1280), 1024u);  // IPv6's minimum link MTU
  EXPECT_EQ(roce_mtu_for(576), 256u);
}

TEST(ActiveMtu, IsTheSmallestOfTheInterfacesThatLeaveTheHost) {
  const InterfaceAddress lo_only[] = {iface("lo", 65536, true)};
  EXPECT_EQ(active_mtu_for(lo_only), 4096u) << "lo alone: 4096";
  const InterfaceAddress veth[] = {iface("lo", 65536, true), iface("veth0", 1500, false)};
  EXPECT_EQ(active_mtu_for(veth), 1024u);
  const InterfaceAddress mixed[] = {iface("lo", 65536, true), iface("jumbo", 9000, false), iface("eth0", 1500, false),
                                    iface("down", 576, false, false)};
  EXPECT_EQ(active_mtu_for(mixed), 1024u) << "a down interface does not count";
  EXPECT_EQ(mtu_enum(1024), IBV_MTU_1024);
  EXPECT_EQ(mtu_enum(4096), IBV_MTU_4096);
  EXPECT_EQ(mtu_enum(256), IBV_MTU_256);
}

// Each GID carries its interface's RoCE MTU: rdma_cm's path record takes it
// from the id's interface, as the kernel does from the netdev.
TEST(GidTable, EachEntryCarriesItsInterfacesRoceMtu) {
  InterfaceAddress lo = v4("127.0.0.1", 1, "lo");
  lo.mtu = 65536;
  InterfaceAddress eth = v4("198.18.0.1", 2, "eth0");
  eth.mtu = 1500;
  InterfaceAddress jumbo = v6("2001:2::1", 3, "jumbo");
  jumbo.mtu = 9000;
  InterfaceAddress unknown = v4("198.18.1.1", 4, "tun0");
  const InterfaceAddress all[] = {lo, eth, jumbo, unknown};
  const auto gids = build_gid_table(all);
  ASSERT_EQ(gids.size(), 4u);
  // In table order: eth0, tun0 (IPv4), jumbo (IPv6), lo.
  EXPECT_EQ(gids[0].mtu, 1024u);
  EXPECT_EQ(gids[1].mtu, 0u) << "no MTU known for tun0";
  EXPECT_EQ(gids[2].mtu, 4096u);
  EXPECT_EQ(gids[3].mtu, 4096u);
}

}  // namespace
}  // namespace softhca::engine
