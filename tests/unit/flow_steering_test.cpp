// Flow steering (transport/flow_steering): ibv_flow_attr parsing and its
// errors, frame keys, matching of each spec type under masks, and the choice
// of receivers by rule type and priority.
#include "transport/flow_steering.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace softhca::transport {
namespace {

const uint8_t kDstMac[6] = {0x01, 0x50, 0x56, 0x19, 0x20, 0xa7};
const uint8_t kSrcMac[6] = {0x24, 0x8a, 0x07, 0xa5, 0x28, 0xc8};

// An ibv_flow_attr followed by its specs, as an application lays it out.
class AttrBuilder {
 public:
  explicit AttrBuilder(ibv_flow_attr_type type = IBV_FLOW_ATTR_NORMAL, uint16_t priority = 0) {
    bytes_.resize(sizeof(ibv_flow_attr));
    attr().type = type;
    attr().priority = priority;
    attr().port = 1;
    attr().size = sizeof(ibv_flow_attr);
  }
  template <typename Spec>
  AttrBuilder& add(const Spec& spec) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof spec);
    std::memcpy(bytes_.data() + at, &spec, sizeof spec);
    ++attr().num_of_specs;
    attr().size = static_cast<uint16_t>(bytes_.size());
    return *this;
  }
  ibv_flow_attr& attr() { return *reinterpret_cast<ibv_flow_attr*>(bytes_.data()); }
  Result<FlowRule> parse() { return parse_flow_rule(attr()); }

 private:
  std::vector<uint8_t> bytes_;
};

ibv_flow_spec_eth eth_spec(uint16_t ether_type = 0x0800) {
  ibv_flow_spec_eth s{};
  s.type = IBV_FLOW_SPEC_ETH;
  s.size = sizeof s;
  std::memcpy(s.val.dst_mac, kDstMac, 6);
  std::memset(s.mask.dst_mac, 0xff, 6);
  std::memcpy(s.val.src_mac, kSrcMac, 6);
  std::memset(s.mask.src_mac, 0xff, 6);
  s.val.ether_type = htons(ether_type);
  s.mask.ether_type = 0xffff;
  return s;
}

ibv_flow_spec_ipv4_ext ipv4_spec(const char* src, const char* dst, uint8_t proto = 17) {
  ibv_flow_spec_ipv4_ext s{};
  s.type = IBV_FLOW_SPEC_IPV4_EXT;
  s.size = sizeof s;
  inet_pton(AF_INET, src, &s.val.src_ip);
  inet_pton(AF_INET, dst, &s.val.dst_ip);
  s.mask.src_ip = s.mask.dst_ip = 0xffffffff;
  s.val.proto = proto;
  s.mask.proto = 0xff;
  return s;
}

ibv_flow_spec_ipv6 ipv6_spec(const char* src, const char* dst, uint8_t next_hdr = 17) {
  ibv_flow_spec_ipv6 s{};
  s.type = IBV_FLOW_SPEC_IPV6;
  s.size = sizeof s;
  inet_pton(AF_INET6, src, s.val.src_ip);
  inet_pton(AF_INET6, dst, s.val.dst_ip);
  std::memset(s.mask.src_ip, 0xff, 16);
  std::memset(s.mask.dst_ip, 0xff, 16);
  s.val.next_hdr = next_hdr;
  s.mask.next_hdr = 0xff;
  return s;
}

ibv_flow_spec_tcp_udp ports_spec(ibv_flow_spec_type type, uint16_t src, uint16_t dst) {
  ibv_flow_spec_tcp_udp s{};
  s.type = type;
  s.size = sizeof s;
  s.val.src_port = htons(src);
  s.val.dst_port = htons(dst);
  s.mask.src_port = s.mask.dst_port = 0xffff;
  return s;
}

void put16(std::vector<uint8_t>& f, uint16_t v) {
  f.push_back(static_cast<uint8_t>(v >> 8));
  f.push_back(static_cast<uint8_t>(v));
}

struct FrameSpec {
  int ip_version = 4;
  uint8_t l4 = 17;
  const char* src_ip = "1.1.1.1";
  const char* dst_ip = "2.2.2.2";
  const char* src_ip6 = "a0a1::a2a3:a4a5:a6a7:a8a9";
  const char* dst_ip6 = "b0b1::b2b3:b4b5:b6b7:b8b9";
  uint16_t src_port = 1234;
  uint16_t dst_port = 5678;
  const uint8_t* dst_mac = kDstMac;
  bool vlan = false;
};

// An Ethernet | IPv4 or IPv6 | UDP or TCP frame, as pyverbs' gen_packet builds one.
std::vector<uint8_t> frame(const FrameSpec& s = {}) {
  std::vector<uint8_t> f(s.dst_mac, s.dst_mac + 6);
  f.insert(f.end(), kSrcMac, kSrcMac + 6);
  if (s.vlan) {
    put16(f, 0x8100);
    put16(f, 0x6000 | 100);
  }
  put16(f, s.ip_version == 4 ? 0x0800 : 0x86dd);
  if (s.ip_version == 4) {
    const uint8_t hdr[12] = {0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, s.l4, 0, 0};
    f.insert(f.end(), hdr, hdr + 12);
    uint8_t a[4];
    inet_pton(AF_INET, s.src_ip, a);
    f.insert(f.end(), a, a + 4);
    inet_pton(AF_INET, s.dst_ip, a);
    f.insert(f.end(), a, a + 4);
  } else {
    const uint8_t hdr[8] = {0x60, 0, 0, 0, 0, 40, s.l4, 64};
    f.insert(f.end(), hdr, hdr + 8);
    uint8_t a[16];
    inet_pton(AF_INET6, s.src_ip6, a);
    f.insert(f.end(), a, a + 16);
    inet_pton(AF_INET6, s.dst_ip6, a);
    f.insert(f.end(), a, a + 16);
  }
  put16(f, s.src_port);
  put16(f, s.dst_port);
  f.resize(f.size() + (s.l4 == 6 ? 16 : 4), 0);
  f.resize(f.size() + 32, 'a');
  return f;
}

FrameKeys keys_of(const std::vector<uint8_t>& f) {
  FrameKeys k;
  EXPECT_TRUE(parse_frame(f, k));
  return k;
}

FlowRule rule_of(AttrBuilder b) {
  auto r = b.parse();
  EXPECT_TRUE(r.has_value());
  return r.value_or(FlowRule{});
}

TEST(FlowSteering, EthSpecMatchesMacsAndEthertype) {
  const FlowRule rule = rule_of(AttrBuilder().add(eth_spec()));
  EXPECT_TRUE(rule_matches(rule, keys_of(frame())));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.ip_version = 6}))));  // other ethertype
  const uint8_t other_mac[6] = {0x02, 0, 0, 0, 0, 1};
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.dst_mac = other_mac}))));
  // The ethertype after a VLAN tag is the one matched.
  EXPECT_TRUE(rule_matches(rule, keys_of(frame({.vlan = true}))));
}

TEST(FlowSteering, MaskSelectsTheBitsCompared) {
  ibv_flow_spec_eth s = eth_spec();
  std::memset(&s.mask, 0, sizeof s.mask);
  s.mask.dst_mac[0] = 0x01;  // the group bit only
  const FlowRule rule = rule_of(AttrBuilder().add(s));
  EXPECT_TRUE(rule_matches(rule, keys_of(frame({.ip_version = 6}))));
  const uint8_t unicast[6] = {0x02, 0, 0, 0, 0, 1};
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.dst_mac = unicast}))));
  // Value bits outside the mask are ignored.
  ibv_flow_spec_eth loose{};
  loose.type = IBV_FLOW_SPEC_ETH;
  loose.size = sizeof loose;
  std::memset(loose.val.src_mac, 0xee, 6);
  EXPECT_TRUE(rule_matches(rule_of(AttrBuilder().add(loose)), keys_of(frame())));
}

TEST(FlowSteering, Ipv4SpecRequiresIpv4AndAddresses) {
  const FlowRule rule = rule_of(AttrBuilder().add(ipv4_spec("1.1.1.1", "2.2.2.2")));
  EXPECT_TRUE(rule_matches(rule, keys_of(frame())));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.src_ip = "1.1.1.2"}))));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.l4 = 6}))));  // proto
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.ip_version = 6}))));
  // The short IPv4 spec: addresses only.
  ibv_flow_spec_ipv4 short_spec{};
  short_spec.type = IBV_FLOW_SPEC_IPV4;
  short_spec.size = sizeof short_spec;
  inet_pton(AF_INET, "2.2.2.2", &short_spec.val.dst_ip);
  short_spec.mask.dst_ip = 0xffffffff;
  const FlowRule by_dst = rule_of(AttrBuilder().add(short_spec));
  EXPECT_TRUE(rule_matches(by_dst, keys_of(frame({.l4 = 6}))));
  EXPECT_FALSE(rule_matches(by_dst, keys_of(frame({.dst_ip = "2.2.2.3"}))));
}

TEST(FlowSteering, Ipv6SpecRequiresIpv6AndAddresses) {
  const FlowRule rule = rule_of(
      AttrBuilder().add(eth_spec(0x86dd)).add(ipv6_spec("a0a1::a2a3:a4a5:a6a7:a8a9", "b0b1::b2b3:b4b5:b6b7:b8b9")));
  EXPECT_TRUE(rule_matches(rule, keys_of(frame({.ip_version = 6}))));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.ip_version = 6, .dst_ip6 = "b0b1::1"}))));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame())));
}

TEST(FlowSteering, TcpAndUdpSpecsMatchPortsOfTheirProtocol) {
  const FlowRule udp = rule_of(AttrBuilder().add(ports_spec(IBV_FLOW_SPEC_UDP, 1234, 5678)));
  const FlowRule tcp = rule_of(AttrBuilder().add(ports_spec(IBV_FLOW_SPEC_TCP, 1234, 5678)));
  EXPECT_TRUE(rule_matches(udp, keys_of(frame())));
  EXPECT_FALSE(rule_matches(tcp, keys_of(frame())));
  EXPECT_TRUE(rule_matches(tcp, keys_of(frame({.ip_version = 6, .l4 = 6}))));
  EXPECT_FALSE(rule_matches(udp, keys_of(frame({.dst_port = 5679}))));
  EXPECT_FALSE(rule_matches(udp, keys_of(frame({.src_port = 1}))));
}

TEST(FlowSteering, AllLayersTogether) {
  const FlowRule rule = rule_of(AttrBuilder()
                                    .add(eth_spec())
                                    .add(ipv4_spec("1.1.1.1", "2.2.2.2"))
                                    .add(ports_spec(IBV_FLOW_SPEC_UDP, 1234, 5678)));
  EXPECT_EQ(rule.num_specs, 3);
  EXPECT_TRUE(rule_matches(rule, keys_of(frame())));
  EXPECT_FALSE(rule_matches(rule, keys_of(frame({.dst_port = 1}))));
}

TEST(FlowSteering, ShortFramesMatchNothing) {
  FrameKeys k;
  const std::vector<uint8_t> tiny(13, 0);
  EXPECT_FALSE(parse_frame(tiny, k));
  // A truncated IPv4 header: Ethernet keys only.
  std::vector<uint8_t> f = frame();
  f.resize(20);
  ASSERT_TRUE(parse_frame(f, k));
  EXPECT_FALSE(k.has_ipv4);
  EXPECT_FALSE(rule_matches(rule_of(AttrBuilder().add(ipv4_spec("1.1.1.1", "2.2.2.2"))), k));
}

TEST(FlowSteering, ParseErrors) {
  {
    AttrBuilder b;
    b.attr().port = 2;
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b;
    b.attr().comp_mask = 1;
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b;
    const uint32_t unknown_type = 7;
    std::memcpy(&b.attr().type, &unknown_type, sizeof unknown_type);
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b;
    b.attr().flags = IBV_FLOW_ATTR_FLAGS_EGRESS;
    EXPECT_EQ(b.parse().error(), std::errc::operation_not_supported);
  }
  {
    AttrBuilder b(IBV_FLOW_ATTR_SNIFFER);
    b.attr().flags = IBV_FLOW_ATTR_FLAGS_DONT_TRAP;
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b(IBV_FLOW_ATTR_ALL_DEFAULT);
    b.add(eth_spec());
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b;
    b.add(eth_spec()).add(eth_spec());
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    AttrBuilder b;
    b.add(ipv4_spec("1.1.1.1", "2.2.2.2")).add(ipv6_spec("::1", "::2"));
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    ibv_flow_spec_eth s = eth_spec();
    s.size = sizeof s - 2;
    AttrBuilder b;
    b.add(s);
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    ibv_flow_spec_eth s = eth_spec();
    const uint32_t unknown_type = 0x77;
    std::memcpy(&s.type, &unknown_type, sizeof unknown_type);
    AttrBuilder b;
    b.add(s);
    EXPECT_EQ(b.parse().error(), std::errc::invalid_argument);
  }
  {
    ibv_flow_spec_tunnel s{};
    s.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
    s.size = sizeof s;
    AttrBuilder b;
    b.add(s);
    EXPECT_EQ(b.parse().error(), std::errc::operation_not_supported);
  }
  {
    ibv_flow_spec_eth s = eth_spec();
    s.type = static_cast<ibv_flow_spec_type>(IBV_FLOW_SPEC_ETH | IBV_FLOW_SPEC_INNER);
    AttrBuilder b;
    b.add(s);
    EXPECT_EQ(b.parse().error(), std::errc::operation_not_supported);
  }
}

TEST(FlowSteering, LongerSpecWithZeroTailIsAccepted) {
  struct {
    ibv_flow_spec_tcp_udp spec;
    uint32_t extra;
  } longer{ports_spec(IBV_FLOW_SPEC_UDP, 1234, 5678), 0};
  longer.spec.size = sizeof longer;
  AttrBuilder ok;
  ok.add(longer);
  EXPECT_TRUE(ok.parse().has_value());
  longer.extra = 1;
  AttrBuilder bad;
  bad.add(longer);
  EXPECT_EQ(bad.parse().error(), std::errc::operation_not_supported);
}

TEST(FlowTable, NoMatchNoReceiver) {
  FlowTable t;
  t.add(1, 0x11, rule_of(AttrBuilder().add(ports_spec(IBV_FLOW_SPEC_TCP, 1, 2))));
  std::vector<uint32_t> out;
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_TRUE(out.empty());
}

TEST(FlowTable, LowerPriorityValueWinsAndTraps) {
  FlowTable t;
  t.add(1, 0x11, rule_of(AttrBuilder(IBV_FLOW_ATTR_NORMAL, 5).add(eth_spec())));
  t.add(2, 0x22, rule_of(AttrBuilder(IBV_FLOW_ATTR_NORMAL, 1).add(ipv4_spec("1.1.1.1", "2.2.2.2"))));
  std::vector<uint32_t> out;
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, std::vector<uint32_t>{0x22});
  // A frame the high-priority rule misses goes to the next one.
  out.clear();
  t.select(keys_of(frame({.dst_ip = "3.3.3.3"})), 0x99, out);
  EXPECT_EQ(out, std::vector<uint32_t>{0x11});
  // Once removed, the lower priority rule takes it.
  EXPECT_TRUE(t.remove(2));
  EXPECT_FALSE(t.remove(2));
  out.clear();
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, std::vector<uint32_t>{0x11});
}

TEST(FlowTable, SamePriorityMatchesAllReceiveOneCopyEach) {
  FlowTable t;
  t.add(1, 0x11, rule_of(AttrBuilder().add(eth_spec())));
  t.add(2, 0x22, rule_of(AttrBuilder().add(eth_spec())));
  t.add(3, 0x11, rule_of(AttrBuilder().add(ipv4_spec("1.1.1.1", "2.2.2.2"))));
  std::vector<uint32_t> out;
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0x11, 0x22}));
}

TEST(FlowTable, DontTrapLetsTheFrameGoOn) {
  FlowTable t;
  AttrBuilder first(IBV_FLOW_ATTR_NORMAL, 0);
  first.add(eth_spec());
  first.attr().flags = IBV_FLOW_ATTR_FLAGS_DONT_TRAP;
  t.add(1, 0x11, rule_of(first));
  t.add(2, 0x22, rule_of(AttrBuilder(IBV_FLOW_ATTR_NORMAL, 3).add(eth_spec())));
  t.add(3, 0x33, rule_of(AttrBuilder(IBV_FLOW_ATTR_NORMAL, 7).add(eth_spec())));
  std::vector<uint32_t> out;
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0x11, 0x22}));
}

TEST(FlowTable, SnifferAndDefaults) {
  FlowTable t;
  t.add(1, 0x11, rule_of(AttrBuilder(IBV_FLOW_ATTR_SNIFFER)));
  t.add(2, 0x22, rule_of(AttrBuilder(IBV_FLOW_ATTR_ALL_DEFAULT)));
  t.add(3, 0x33, rule_of(AttrBuilder(IBV_FLOW_ATTR_MC_DEFAULT)));
  std::vector<uint32_t> out;
  // Multicast destination (01:...), nothing steered: sniffer and both defaults.
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0x11, 0x22, 0x33}));
  // Unicast: no MC_DEFAULT.
  const uint8_t unicast[6] = {0x02, 0, 0, 0, 0, 1};
  out.clear();
  t.select(keys_of(frame({.dst_mac = unicast})), 0x99, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0x11, 0x22}));
  // Steered by a NORMAL rule: the defaults get nothing, the sniffer still a copy.
  t.add(4, 0x44, rule_of(AttrBuilder().add(eth_spec())));
  out.clear();
  t.select(keys_of(frame()), 0x99, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0x11, 0x44}));
}

TEST(FlowTable, SenderNeverReceivesItsOwnFrame) {
  FlowTable t;
  t.add(1, 0x11, rule_of(AttrBuilder(IBV_FLOW_ATTR_SNIFFER)));
  t.add(2, 0x22, rule_of(AttrBuilder().add(eth_spec())));
  std::vector<uint32_t> out;
  t.select(keys_of(frame()), 0x11, out);
  EXPECT_EQ(out, std::vector<uint32_t>{0x22});
}

// Microsoft's RSS verification suite (the key and the IPv4 rows every NIC
// driver checks against).
constexpr std::array<uint8_t, kRxHashKeyBytes> kMsKey = {
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
    0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
    0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};

TEST(RxHash, ToeplitzMatchesTheVerificationSuite) {
  const RxHash ip_only{IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4, kMsKey};
  const RxHash with_ports{ip_only.fields | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP, kMsKey};
  EXPECT_EQ(rx_hash(ip_only, keys_of(frame({.l4 = 6, .src_ip = "66.9.149.187", .dst_ip = "161.142.100.80",
                                            .src_port = 2794, .dst_port = 1766}))),
            0x323e8fc2u);
  EXPECT_EQ(rx_hash(with_ports, keys_of(frame({.l4 = 6, .src_ip = "66.9.149.187", .dst_ip = "161.142.100.80",
                                               .src_port = 2794, .dst_port = 1766}))),
            0x51ccc178u);
  EXPECT_EQ(rx_hash(ip_only, keys_of(frame({.l4 = 6, .src_ip = "199.92.111.2", .dst_ip = "65.69.140.83"}))),
            0xd718262au);
  EXPECT_EQ(rx_hash(with_ports, keys_of(frame({.l4 = 6, .src_ip = "199.92.111.2", .dst_ip = "65.69.140.83",
                                               .src_port = 14230, .dst_port = 4739}))),
            0xc626b0eau);
  // UDP port bits do not hash TCP ports.
  const RxHash udp_ports{ip_only.fields | IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP, kMsKey};
  EXPECT_EQ(rx_hash(udp_ports, keys_of(frame({.l4 = 6, .src_ip = "66.9.149.187", .dst_ip = "161.142.100.80",
                                              .src_port = 2794, .dst_port = 1766}))),
            0x323e8fc2u);
}

TEST(FlowTable, RssSpreadsOverWorkQueuesByHash) {
  FlowTable t;
  FlowTarget target{0x50, {0x51, 0x52, 0x53, 0x54}, RxHash{IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4, kMsKey}};
  t.add(1, target, rule_of(AttrBuilder().add(eth_spec())));
  std::vector<uint32_t> seen;
  for (int i = 0; i < 32; ++i) {
    const std::string src = std::to_string(i) + "." + std::to_string(i + 1) + ".2.3";
    const FrameKeys k = keys_of(frame({.src_ip = src.c_str()}));
    std::vector<uint32_t> out;
    t.select(k, 0x99, out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0], target.spread[rx_hash(target.hash, k) & 3]);
    if (std::find(seen.begin(), seen.end(), out[0]) == seen.end()) seen.push_back(out[0]);
  }
  EXPECT_GT(seen.size(), 1u);  // spread, not all on one queue
}

}  // namespace
}  // namespace softhca::transport
