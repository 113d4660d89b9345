// The rtnetlink messages of address resolution's neighbour check
// (cm/neighbour.hpp): requests byte by byte, and replies crafted here as the
// kernel would send them (routes with and without a gateway, local routes,
// neighbour entries in each state, errors, messages for other requests).
#include "cm/neighbour.hpp"

#include <gtest/gtest.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include <cstring>

namespace softhca::cm::neighbour {
namespace {

constexpr std::size_t kHeader = NLMSG_ALIGN(sizeof(nlmsghdr));

IpAddress v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  IpAddress ip;
  ip.family = AF_INET;
  ip.addr[10] = ip.addr[11] = 0xff;
  ip.addr[12] = a;
  ip.addr[13] = b;
  ip.addr[14] = c;
  ip.addr[15] = d;
  return ip;
}

IpAddress v6(std::initializer_list<uint8_t> bytes) {
  IpAddress ip;
  ip.family = AF_INET6;
  std::size_t i = 0;
  for (uint8_t b : bytes) ip.addr[i++] = b;
  return ip;
}

// Builds netlink messages the way the kernel lays them out.
class Reply {
 public:
  // Starts a message; `body` is its family header (rtmsg, ndmsg, nlmsgerr).
  template <typename Body>
  Reply& message(uint16_t type, uint32_t seq, const Body& body) {
    start_ = bytes_.size();
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_seq = seq;
    append(&h, sizeof h);
    append(&body, sizeof body);
    finish();
    return *this;
  }
  Reply& attr(uint16_t type, const void* value, std::size_t len) {
    rtattr a{};
    a.rta_len = static_cast<unsigned short>(sizeof a + len);
    a.rta_type = type;
    append(&a, sizeof a);
    append(value, len);
    finish();
    return *this;
  }
  Reply& attr_u32(uint16_t type, uint32_t v) { return attr(type, &v, sizeof v); }
  Reply& attr_ip(uint16_t type, const IpAddress& ip) {
    return ip.family == AF_INET ? attr(type, ip.addr.data() + 12, 4) : attr(type, ip.addr.data(), 16);
  }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  void append(const void* p, std::size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    bytes_.resize((bytes_.size() + 3) & ~std::size_t{3}, 0);
  }
  void finish() {
    const uint32_t len = static_cast<uint32_t>(bytes_.size() - start_);
    std::memcpy(bytes_.data() + start_, &len, sizeof len);
  }
  std::vector<uint8_t> bytes_;
  std::size_t start_ = 0;
};

rtmsg route(uint8_t family, uint8_t type) {
  rtmsg r{};
  r.rtm_family = family;
  r.rtm_dst_len = family == AF_INET ? 32 : 128;
  r.rtm_table = RT_TABLE_MAIN;
  r.rtm_type = type;
  return r;
}

ndmsg entry(uint8_t family, int ifindex, uint16_t state) {
  ndmsg n{};
  n.ndm_family = family;
  n.ndm_ifindex = ifindex;
  n.ndm_state = state;
  return n;
}

nlmsgerr error(int err) {
  nlmsgerr e{};
  e.error = err;
  return e;
}

TEST(NeighbourVerdict, FollowsTheKernelsValidStates) {
  for (uint16_t s : {NUD_REACHABLE, NUD_STALE, NUD_DELAY, NUD_PROBE, NUD_PERMANENT, NUD_NOARP})
    EXPECT_EQ(judge(s), Verdict::kValid) << s;
  EXPECT_EQ(judge(NUD_INCOMPLETE), Verdict::kResolving);
  EXPECT_EQ(judge(NUD_FAILED), Verdict::kIdle);
  EXPECT_EQ(judge(NUD_NONE), Verdict::kIdle);  // also what an absent entry reads as
}

TEST(NeighbourRequests, RouteRequestAsksForOneHostRoute) {
  const auto req = route_request(v4(198, 18, 0, 5), 77);
  ASSERT_EQ(req.size(), kHeader + sizeof(rtmsg) + 8);
  nlmsghdr h;
  std::memcpy(&h, req.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_len, req.size());
  EXPECT_EQ(h.nlmsg_type, RTM_GETROUTE);
  EXPECT_EQ(h.nlmsg_flags, NLM_F_REQUEST);
  EXPECT_EQ(h.nlmsg_seq, 77u);
  rtmsg r;
  std::memcpy(&r, req.data() + kHeader, sizeof r);
  EXPECT_EQ(r.rtm_family, AF_INET);
  EXPECT_EQ(r.rtm_dst_len, 32);
  const uint8_t attr[] = {8, 0, RTA_DST, 0, 198, 18, 0, 5};
  EXPECT_EQ(std::memcmp(req.data() + kHeader + sizeof r, attr, sizeof attr), 0);

  const auto req6 = route_request(v6({0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3}), 78);
  ASSERT_EQ(req6.size(), kHeader + sizeof(rtmsg) + 20);
  std::memcpy(&r, req6.data() + kHeader, sizeof r);
  EXPECT_EQ(r.rtm_family, AF_INET6);
  EXPECT_EQ(r.rtm_dst_len, 128);
  EXPECT_EQ(req6.back(), 3);
}

TEST(NeighbourRequests, AScopedAddressIsRoutedOnItsInterface) {
  IpAddress dst = v6({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2});
  dst.scope_id = 6;
  const auto req = route_request(dst, 1);
  ASSERT_EQ(req.size(), kHeader + sizeof(rtmsg) + 20 + 8);
  nlmsghdr h;
  std::memcpy(&h, req.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_len, req.size());
  const uint8_t oif[] = {8, 0, RTA_OIF, 0, 6, 0, 0, 0};  // host order: a little-endian host's bytes
  EXPECT_EQ(std::memcmp(req.data() + req.size() - 8, oif, sizeof oif), 0);
}

TEST(NeighbourRequests, NeighbourRequestNamesTheInterfaceAndAddress) {
  NextHop hop;
  hop.ifindex = 7;
  hop.addr = v4(10, 0, 0, 1);
  const auto req = neighbour_request(hop, 9);
  ASSERT_EQ(req.size(), kHeader + sizeof(ndmsg) + 8);
  nlmsghdr h;
  std::memcpy(&h, req.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_type, RTM_GETNEIGH);
  EXPECT_EQ(h.nlmsg_seq, 9u);
  ndmsg n;
  std::memcpy(&n, req.data() + kHeader, sizeof n);
  EXPECT_EQ(n.ndm_family, AF_INET);
  EXPECT_EQ(n.ndm_ifindex, 7);
  const uint8_t attr[] = {8, 0, NDA_DST, 0, 10, 0, 0, 1};
  EXPECT_EQ(std::memcmp(req.data() + kHeader + sizeof n, attr, sizeof attr), 0);
}

TEST(NeighbourRoutes, AGatewayIsTheNextHop) {
  const IpAddress dst = v4(198, 51, 100, 7);
  Reply r;
  r.message(RTM_NEWROUTE, 5, route(AF_INET, RTN_UNICAST))
      .attr_u32(RTA_TABLE, RT_TABLE_MAIN)
      .attr_ip(RTA_DST, dst)
      .attr_u32(RTA_OIF, 3)
      .attr_ip(RTA_PREFSRC, v4(10, 0, 0, 2))
      .attr_ip(RTA_GATEWAY, v4(10, 0, 0, 1));
  auto hop = parse_route_reply(r.bytes(), 5, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_EQ(hop->ifindex, 3);
  EXPECT_EQ(hop->addr, v4(10, 0, 0, 1));
  EXPECT_FALSE(hop->local);
}

TEST(NeighbourRoutes, OnLinkTheDestinationIsTheNextHop) {
  IpAddress dst = v4(198, 18, 0, 5);
  dst.port = 7174;
  Reply r;
  r.message(RTM_NEWROUTE, 6, route(AF_INET, RTN_UNICAST)).attr_ip(RTA_DST, dst).attr_u32(RTA_OIF, 4);
  auto hop = parse_route_reply(r.bytes(), 6, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_EQ(hop->ifindex, 4);
  EXPECT_EQ(hop->addr, v4(198, 18, 0, 5));  // without the port
}

TEST(NeighbourRoutes, Ipv6GatewayAndLocalRoutes) {
  const IpAddress dst = v6({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9});
  const IpAddress gw = v6({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
  Reply r;
  r.message(RTM_NEWROUTE, 1, route(AF_INET6, RTN_UNICAST)).attr_ip(RTA_GATEWAY, gw).attr_u32(RTA_OIF, 2);
  auto hop = parse_route_reply(r.bytes(), 1, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_EQ(hop->addr, gw);

  Reply local;
  local.message(RTM_NEWROUTE, 2, route(AF_INET6, RTN_LOCAL)).attr_u32(RTA_OIF, 1);
  hop = parse_route_reply(local.bytes(), 2, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_TRUE(hop->local);
}

TEST(NeighbourRoutes, AnIpv6GatewayOfAnIpv4Route) {
  const IpAddress dst = v4(198, 51, 100, 7);
  const IpAddress gw = v6({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
  uint8_t via[2 + 16];
  const uint16_t family = AF_INET6;
  std::memcpy(via, &family, 2);
  std::memcpy(via + 2, gw.addr.data(), 16);
  Reply r;
  r.message(RTM_NEWROUTE, 3, route(AF_INET, RTN_UNICAST)).attr(RTA_VIA, via, sizeof via).attr_u32(RTA_OIF, 2);
  auto hop = parse_route_reply(r.bytes(), 3, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_EQ(hop->addr, gw);
  const auto req = neighbour_request(*hop, 4);
  ndmsg n;
  std::memcpy(&n, req.data() + kHeader, sizeof n);
  EXPECT_EQ(n.ndm_family, AF_INET6);
  EXPECT_EQ(req.size(), kHeader + sizeof n + 20);
}

TEST(NeighbourRoutes, ErrorsAndMessagesForOthers) {
  const IpAddress dst = v4(198, 18, 0, 5);
  Reply unreachable;
  unreachable.message(NLMSG_ERROR, 8, error(-ENETUNREACH));
  auto hop = parse_route_reply(unreachable.bytes(), 8, dst);
  ASSERT_FALSE(hop.has_value());
  EXPECT_EQ(hop.error(), std::errc::network_unreachable);

  // An answer to another request first, then ours.
  Reply two;
  two.message(RTM_NEWROUTE, 3, route(AF_INET, RTN_UNICAST)).attr_u32(RTA_OIF, 9);
  two.message(RTM_NEWROUTE, 4, route(AF_INET, RTN_UNICAST)).attr_u32(RTA_OIF, 5);
  hop = parse_route_reply(two.bytes(), 4, dst);
  ASSERT_TRUE(hop.has_value());
  EXPECT_EQ(hop->ifindex, 5);

  Reply none;
  none.message(RTM_NEWROUTE, 3, route(AF_INET, RTN_UNICAST)).attr_u32(RTA_OIF, 9);
  EXPECT_EQ(parse_route_reply(none.bytes(), 4, dst).error(), std::errc::bad_message);

  Reply no_oif;
  no_oif.message(RTM_NEWROUTE, 4, route(AF_INET, RTN_UNICAST)).attr_ip(RTA_DST, dst);
  EXPECT_EQ(parse_route_reply(no_oif.bytes(), 4, dst).error(), std::errc::bad_message);

  Reply ack;
  ack.message(NLMSG_ERROR, 4, error(0));
  EXPECT_EQ(parse_route_reply(ack.bytes(), 4, dst).error(), std::errc::bad_message);
}

TEST(NeighbourRoutes, TruncatedRepliesAreRefused) {
  const IpAddress dst = v4(198, 18, 0, 5);
  Reply r;
  r.message(RTM_NEWROUTE, 4, route(AF_INET, RTN_UNICAST)).attr_u32(RTA_OIF, 5);
  const auto full = r.bytes();
  for (std::size_t cut : {std::size_t{0}, std::size_t{10}, kHeader + 4, full.size() - 2})
    EXPECT_FALSE(parse_route_reply(full.first(cut), 4, dst).has_value()) << cut;

  // An attribute that claims more than the message holds.
  std::vector<uint8_t> bad(full.begin(), full.end());
  bad[kHeader + sizeof(rtmsg)] = 40;
  EXPECT_EQ(parse_route_reply(bad, 4, dst).error(), std::errc::bad_message);
}

TEST(NeighbourEntries, StatesAbsenceAndErrors) {
  Reply reachable;
  reachable.message(RTM_NEWNEIGH, 11, entry(AF_INET, 4, NUD_REACHABLE)).attr_ip(NDA_DST, v4(198, 18, 0, 1));
  auto st = parse_neighbour_reply(reachable.bytes(), 11);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(*st, NUD_REACHABLE);
  EXPECT_EQ(judge(*st), Verdict::kValid);

  Reply incomplete;
  incomplete.message(RTM_NEWNEIGH, 12, entry(AF_INET6, 4, NUD_INCOMPLETE));
  st = parse_neighbour_reply(incomplete.bytes(), 12);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(judge(*st), Verdict::kResolving);

  Reply failed;
  failed.message(RTM_NEWNEIGH, 13, entry(AF_INET, 4, NUD_FAILED));
  st = parse_neighbour_reply(failed.bytes(), 13);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(judge(*st), Verdict::kIdle);

  Reply absent;
  absent.message(NLMSG_ERROR, 14, error(-ENOENT));
  st = parse_neighbour_reply(absent.bytes(), 14);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(*st, NUD_NONE);
  EXPECT_EQ(judge(*st), Verdict::kIdle);

  Reply refused;  // a kernel without RTM_GETNEIGH for one entry
  refused.message(NLMSG_ERROR, 15, error(-EINVAL));
  EXPECT_EQ(parse_neighbour_reply(refused.bytes(), 15).error(), std::errc::invalid_argument);

  Reply other;
  other.message(RTM_NEWROUTE, 16, route(AF_INET, RTN_UNICAST));
  EXPECT_EQ(parse_neighbour_reply(other.bytes(), 16).error(), std::errc::bad_message);
}

}  // namespace
}  // namespace softhca::cm::neighbour
