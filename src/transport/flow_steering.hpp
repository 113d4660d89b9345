// Flow steering for raw packet QPs: which QPs of the host's virtual Ethernet
// segment receive a frame. Pure code (no I/O, no locks): the rules as
// ibv_create_flow describes them, the headers of a frame, the match of one
// against the other, and the table that picks the receivers of a frame.
//
// A rule holds up to kMaxFlowSpecs specs, at most one per layer (Ethernet,
// IPv4 or IPv6, TCP or UDP). Each spec keeps its value and mask in the byte
// layout of its ibv_flow_*_filter (network byte order); a frame is turned
// into keys of the same layouts, so a match is (key & mask) == (value & mask)
// byte by byte. An IP spec also requires its IP version, a TCP or UDP spec
// its protocol, as a NIC's parser does.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/result.hpp"

namespace softhca::transport {

inline constexpr int kMaxFlowSpecs = 8;
// The largest key (ibv_flow_ipv6_filter, 40 bytes with its padding).
inline constexpr std::size_t kMaxFlowKeyBytes = 40;
// Bytes of a frame the parser looks at: Ethernet with two VLAN tags, IPv4
// with options or IPv6, and the ports of TCP or UDP.
inline constexpr std::size_t kFlowHeaderBytes = 14 + 8 + 60 + 4;

enum class FlowLayer : uint8_t { kEth, kIpv4, kIpv6, kTcp, kUdp };

struct FlowSpec {
  FlowLayer layer = FlowLayer::kEth;
  uint8_t key_bytes = 0;
  std::array<uint8_t, kMaxFlowKeyBytes> value{};  // already masked
  std::array<uint8_t, kMaxFlowKeyBytes> mask{};
};

struct FlowRule {
  ibv_flow_attr_type type = IBV_FLOW_ATTR_NORMAL;
  uint16_t priority = 0;   // lower is tested first
  bool dont_trap = false;  // IBV_FLOW_ATTR_FLAGS_DONT_TRAP
  uint8_t num_specs = 0;
  std::array<FlowSpec, kMaxFlowSpecs> specs{};
};

// The rule an ibv_flow_attr and the specs after it describe. EINVAL for a
// malformed one (unknown type, flag or spec type, a spec shorter than its
// struct or with nonzero bytes past it, two specs of one layer, specs on a
// rule type that takes none, a port other than 1); EOPNOTSUPP for what
// verbs defines but softhca does not offer (egress rules, tunnel, ESP,
// MPLS, inner-header and action specs).
Result<FlowRule> parse_flow_rule(const ibv_flow_attr& attr);

// The rule type as the application wrote it: any number, read without
// loading the enum (a value outside ibv_flow_attr_type would be undefined).
inline uint32_t flow_attr_type(const ibv_flow_attr& attr) {
  uint32_t type = 0;
  static_assert(sizeof(attr.type) == sizeof(type));
  std::memcpy(&type, &attr.type, sizeof type);
  return type;
}

// The keys of a frame, in the layouts of the filters.
struct FrameKeys {
  bool has_ipv4 = false;
  bool has_ipv6 = false;
  bool has_tcp = false;
  bool has_udp = false;
  bool multicast = false;  // the destination MAC's group bit
  std::array<uint8_t, sizeof(ibv_flow_eth_filter)> eth{};
  std::array<uint8_t, sizeof(ibv_flow_ipv4_ext_filter)> ipv4{};
  std::array<uint8_t, sizeof(ibv_flow_ipv6_filter)> ipv6{};
  std::array<uint8_t, sizeof(ibv_flow_tcp_udp_filter)> l4{};
};

// Parses the first bytes of a frame (at most kFlowHeaderBytes matter). A
// frame shorter than an Ethernet header gives false: it matches nothing.
bool parse_frame(std::span<const uint8_t> frame, FrameKeys& keys);

bool rule_matches(const FlowRule& rule, const FrameKeys& keys);

// Receive-side scaling: an RSS QP's flows spread their frames over the work
// queues of its indirection table by a Toeplitz hash of chosen fields
// (IBV_RX_HASH_SRC/DST_IPV4, _IPV6, _PORT_TCP, _PORT_UDP), taken in the
// order Microsoft's RSS specification gives: source address, destination
// address, source port, destination port. A field the frame lacks is left
// out of the input.
inline constexpr std::size_t kRxHashKeyBytes = 40;
inline constexpr uint64_t kRxHashFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                          IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP |
                                          IBV_RX_HASH_DST_PORT_TCP | IBV_RX_HASH_SRC_PORT_UDP |
                                          IBV_RX_HASH_DST_PORT_UDP;
struct RxHash {
  uint64_t fields = 0;
  std::array<uint8_t, kRxHashKeyBytes> key{};
};
uint32_t toeplitz_hash(std::span<const uint8_t, kRxHashKeyBytes> key, std::span<const uint8_t> input);
uint32_t rx_hash(const RxHash& hash, const FrameKeys& keys);

// Where the frames of a flow go: its QP, or, for an RSS QP, one of the work
// queues (their QPNs; a power of two of them) the hash picks.
struct FlowTarget {
  uint32_t qpn = 0;
  std::vector<uint32_t> spread;
  RxHash hash;
};

// The flows attached on one virtual Ethernet segment, and the choice of the
// QPs that receive a frame:
//  - every QP with a SNIFFER rule;
//  - NORMAL rules by priority (lowest value first): at each priority every
//    QP with a matching rule receives it; the frame goes on to the next
//    priority only while every rule that matched has DONT_TRAP;
//  - if no NORMAL rule matched: the QPs with an ALL_DEFAULT rule, and for a
//    multicast destination MAC those with an MC_DEFAULT rule.
// A QP receives one copy at most, and never a frame it sent itself.
class FlowTable {
 public:
  void add(uint64_t id, uint32_t qpn, const FlowRule& rule) { add(id, FlowTarget{qpn, {}, {}}, rule); }
  void add(uint64_t id, FlowTarget target, const FlowRule& rule);
  bool remove(uint64_t id);
  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  // The receivers of a frame from `sender_qpn`, appended to `out`.
  void select(const FrameKeys& keys, uint32_t sender_qpn, std::vector<uint32_t>& out) const;

 private:
  struct Entry {
    uint64_t id;
    FlowTarget target;
    FlowRule rule;
  };
  static uint32_t receiver(const Entry& e, const FrameKeys& keys);
  std::vector<Entry> entries_;  // NORMAL rules sorted by priority, stable
};

}  // namespace softhca::transport
