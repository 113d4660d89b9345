// The CM port table: the pure bind/listen rules, and the shared table with a
// private file (binds, ephemeral ports, listeners, dead owners reclaimed),
// plus how addresses map onto the device (cm/address.hpp).
#include "cm/port_table.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>

#include "cm/address.hpp"

namespace softhca::cm {
namespace {

constexpr uint16_t kTcp = 0x0106;
constexpr uint16_t kUdp = 0x0111;

BindKey v4(const char* addr, uint16_t port, uint16_t ps = kTcp) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sin.sin_addr);
  return bind_key(ps, *from_sockaddr(reinterpret_cast<sockaddr*>(&sin)));
}

BindKey v6(const char* addr, uint16_t port, uint16_t ps = kTcp) {
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(port);
  inet_pton(AF_INET6, addr, &sin6.sin6_addr);
  return bind_key(ps, *from_sockaddr(reinterpret_cast<sockaddr*>(&sin6)));
}

TEST(CmPortRules, Conflicts) {
  EXPECT_TRUE(bindings_conflict(v4("127.0.0.1", 7174), v4("127.0.0.1", 7174)));
  EXPECT_FALSE(bindings_conflict(v4("127.0.0.1", 7174), v4("127.0.0.1", 7175)));
  EXPECT_FALSE(bindings_conflict(v4("127.0.0.1", 7174), v4("127.0.0.1", 7174, kUdp)));  // own port space
  EXPECT_FALSE(bindings_conflict(v4("127.0.0.1", 7174), v4("192.0.2.1", 7174)));
  EXPECT_TRUE(bindings_conflict(v4("0.0.0.0", 7174), v4("192.0.2.1", 7174)));
  EXPECT_TRUE(bindings_conflict(v4("127.0.0.1", 7174), v6("::", 7174)));
  // An IPv4-mapped IPv6 address is the IPv4 address.
  EXPECT_TRUE(bindings_conflict(v4("127.0.0.1", 7174), v6("::ffff:127.0.0.1", 7174)));
}

TEST(CmPortRules, ListenerMatching) {
  EXPECT_TRUE(listener_matches(v4("0.0.0.0", 7174), v4("127.0.0.1", 7174)));
  EXPECT_FALSE(listener_matches(v4("0.0.0.0", 7174), v6("::1", 7174)));  // v4 wildcard: v4 only
  EXPECT_TRUE(listener_matches(v6("::", 7174), v4("127.0.0.1", 7174)));   // v6 wildcard takes both
  EXPECT_TRUE(listener_matches(v6("::", 7174), v6("::1", 7174)));
  EXPECT_FALSE(listener_matches(v4("127.0.0.1", 7174), v4("192.0.2.1", 7174)));
  EXPECT_FALSE(listener_matches(v4("127.0.0.1", 7174), v4("127.0.0.1", 7174, kUdp)));

  auto record = [](const BindKey& k, bool listening) {
    BindingRecord r;
    r.proc = 1;
    r.ps = k.ps;
    r.port = k.port;
    r.family = k.family;
    r.wildcard = k.wildcard;
    r.listening = listening;
    r.addr = k.addr;
    return r;
  };
  std::vector<BindingRecord> recs = {record(v4("0.0.0.0", 7174), true), record(v4("127.0.0.1", 7174), true),
                                     record(v4("192.0.2.1", 7175), false)};
  EXPECT_EQ(find_listener_index(recs, v4("127.0.0.1", 7174)), 1u);  // exact beats wildcard
  EXPECT_EQ(find_listener_index(recs, v4("192.0.2.1", 7174)), 0u);
  EXPECT_FALSE(find_listener_index(recs, v4("192.0.2.1", 7175)).has_value());  // bound, not listening
  recs[0].proc = 0;  // freed
  EXPECT_FALSE(find_listener_index(recs, v4("192.0.2.1", 7174)).has_value());
}

class CmPortTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = "/dev/shm/softhca-unit-" + std::to_string(::getpid()) + "-" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".ports";
    auto t = PortTable::open_named(path, true);
    ASSERT_TRUE(t.has_value());
    table_ = *t;
    table_->set_alive_check([](uint32_t pid, uint64_t) { return dead_pid_ == 0 || pid != dead_pid_; });
    dead_pid_ = 0;
  }
  void TearDown() override { delete table_; }
  PortTable* table_ = nullptr;
  static inline uint32_t dead_pid_ = 0;
};

TEST_F(CmPortTableTest, BindConflictAndRelease) {
  auto proc = table_->register_process(1000, 1, "/tmp/x/cm-1000.sock");
  ASSERT_TRUE(proc.has_value());
  auto b1 = table_->bind(*proc, v4("127.0.0.1", 7174));
  ASSERT_TRUE(b1.has_value());
  EXPECT_EQ(b1->second, 7174);
  EXPECT_EQ(table_->bind(*proc, v4("127.0.0.1", 7174)).error(), std::errc::address_in_use);
  EXPECT_EQ(table_->bind(*proc, v4("0.0.0.0", 7174)).error(), std::errc::address_in_use);
  EXPECT_TRUE(table_->bind(*proc, v4("127.0.0.1", 7174, kUdp)).has_value());
  table_->unbind(b1->first);
  EXPECT_TRUE(table_->bind(*proc, v4("0.0.0.0", 7174)).has_value());
}

TEST_F(CmPortTableTest, EphemeralPortsAreDistinctAndInRange) {
  auto proc = table_->register_process(1000, 1, "/tmp/x/cm-1000.sock");
  std::set<uint16_t> ports;
  for (int i = 0; i < 200; ++i) {
    auto b = table_->bind(*proc, v4("127.0.0.1", 0));
    ASSERT_TRUE(b.has_value());
    EXPECT_GE(b->second, kEphemeralFirst);
    EXPECT_LE(b->second, kEphemeralLast);
    EXPECT_TRUE(ports.insert(b->second).second);
  }
}

TEST_F(CmPortTableTest, ListenersAndDeadOwners) {
  auto a = table_->register_process(1000, 1, "/tmp/x/cm-1000.sock");
  auto b = table_->register_process(2000, 1, "/tmp/x/cm-2000.sock");
  ASSERT_TRUE(a && b);
  auto bound = table_->bind(*a, v4("0.0.0.0", 7174));
  ASSERT_TRUE(bound.has_value());
  EXPECT_FALSE(table_->find_listener(v4("127.0.0.1", 7174)).has_value());  // bound only
  table_->set_listening(bound->first, true);
  auto found = table_->find_listener(v4("127.0.0.1", 7174));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->pid, 1000u);
  EXPECT_EQ(found->socket_path, "/tmp/x/cm-1000.sock");

  // Process 1000 dies without cleaning up: its port is taken over, its
  // listener is gone.
  EXPECT_EQ(table_->bind(*b, v4("127.0.0.1", 7174)).error(), std::errc::address_in_use);
  dead_pid_ = 1000;
  EXPECT_TRUE(table_->bind(*b, v4("127.0.0.1", 7174)).has_value());
  EXPECT_FALSE(table_->find_listener(v4("127.0.0.1", 7174)).has_value());
}

TEST_F(CmPortTableTest, UnregisterDropsEverything) {
  auto a = table_->register_process(1000, 1, "/tmp/x/cm-1000.sock");
  auto bound = table_->bind(*a, v4("127.0.0.1", 7174));
  table_->set_listening(bound->first, true);
  table_->unregister_process(*a);
  EXPECT_FALSE(table_->find_listener(v4("127.0.0.1", 7174)).has_value());
  auto b = table_->register_process(2000, 1, "/tmp/x/cm-2000.sock");
  EXPECT_TRUE(table_->bind(*b, v4("127.0.0.1", 7174)).has_value());
}

TEST_F(CmPortTableTest, ProcessesAreFoundByHandleWhileAlive) {
  auto a = table_->register_process(1000, 1, "/tmp/x/cm-1000.sock");
  auto b = table_->register_process(2000, 1, "/tmp/x/cm-2000.sock");
  ASSERT_TRUE(a && b);
  auto found = table_->find_process(*b);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->pid, 2000u);
  EXPECT_EQ(found->socket_path, "/tmp/x/cm-2000.sock");
  EXPECT_FALSE(table_->find_process(0).has_value());
  EXPECT_FALSE(table_->find_process(kMaxCmProcs + 1).has_value());
  dead_pid_ = 1000;
  EXPECT_FALSE(table_->find_process(*a).has_value());
  table_->unregister_process(*b);
  EXPECT_FALSE(table_->find_process(*b).has_value());
}

TEST(CmAddress, SockaddrRoundTripAndWildcards) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(7174);
  inet_pton(AF_INET, "127.0.0.5", &sin.sin_addr);
  auto ip = from_sockaddr(reinterpret_cast<sockaddr*>(&sin));
  ASSERT_TRUE(ip.has_value());
  EXPECT_EQ(ip->port, 7174);
  EXPECT_TRUE(ip->loopback());
  EXPECT_FALSE(ip->wildcard());
  EXPECT_EQ(to_string(*ip), "127.0.0.5:7174");
  sockaddr_storage ss;
  EXPECT_EQ(to_sockaddr(*ip, ss), sizeof(sockaddr_in));
  EXPECT_EQ(std::memcmp(&ss, &sin, sizeof sin), 0);

  EXPECT_TRUE(wildcard_of(AF_INET).wildcard());
  EXPECT_TRUE(wildcard_of(AF_INET6).wildcard());
  sockaddr bad{};
  bad.sa_family = AF_UNIX;
  EXPECT_EQ(from_sockaddr(&bad).error(), std::errc::address_family_not_supported);
  EXPECT_EQ(from_sockaddr(reinterpret_cast<sockaddr*>(&sin), 4).error(), std::errc::invalid_argument);
}

TEST(CmAddress, LocalAddressesMapToGids) {
  std::vector<engine::InterfaceAddress> addrs(2);
  addrs[0].family = AF_INET;
  addrs[0].address = {127, 0, 0, 1};
  addrs[0].ifindex = 1;
  addrs[0].ifname = "lo";
  addrs[1].family = AF_INET;
  addrs[1].address = {192, 0, 2, 2};
  addrs[1].ifindex = 2;
  addrs[1].ifname = "eth0";
  const engine::DeviceInfo dev = engine::make_device_info(addrs, "seed");

  auto ip = [](const char* s) {
    sockaddr_storage ss{};
    if (std::strchr(s, ':') != nullptr) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
      sin6->sin6_family = AF_INET6;
      inet_pton(AF_INET6, s, &sin6->sin6_addr);
    } else {
      auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
      sin->sin_family = AF_INET;
      inet_pton(AF_INET, s, &sin->sin_addr);
    }
    return *from_sockaddr(reinterpret_cast<sockaddr*>(&ss));
  };
  const auto lo = local_gid_index(ip("127.0.0.1"), dev);
  ASSERT_TRUE(lo.has_value());
  EXPECT_EQ(dev.gid_at(*lo)->raw, engine::kLoopbackV4Gid);
  EXPECT_EQ(local_gid_index(ip("127.0.0.9"), dev), lo);  // all of 127/8 goes through lo
  EXPECT_EQ(local_gid_index(ip("::1"), dev), lo);          // no ::1 entry here: lo's IPv4 one
  const auto eth = local_gid_index(ip("192.0.2.2"), dev);
  ASSERT_TRUE(eth.has_value());
  EXPECT_NE(*eth, *lo);
  EXPECT_EQ(local_gid_index(ip("::ffff:192.0.2.2"), dev), eth);
  EXPECT_FALSE(local_gid_index(ip("192.0.2.3"), dev).has_value());  // another host
  EXPECT_FALSE(local_gid_index(ip("8.8.8.8"), dev).has_value());
}

}  // namespace
}  // namespace softhca::cm
