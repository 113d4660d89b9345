// Flow steering: rules, frame keys, matching and the choice of receivers.
// Facts (spec types, filter layouts, rule types, DONT_TRAP, priorities) come
// from rdma-core's <infiniband/verbs.h> and its ibv_create_flow(3) page.
#include "transport/flow_steering.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace softhca::transport {
namespace {

constexpr uint32_t kInnerBit = IBV_FLOW_SPEC_INNER;

struct LayerInfo {
  FlowLayer layer;
  std::size_t spec_bytes;  // sizeof the ibv_flow_spec_* struct
  std::size_t key_bytes;   // sizeof its filter
  std::size_t val_offset;  // offsetof val
  std::size_t mask_offset; // offsetof mask
};

// The spec types softhca matches; false for any other.
bool layer_of(uint32_t type, LayerInfo& out) {
  switch (type) {
    case IBV_FLOW_SPEC_ETH:
      out = {FlowLayer::kEth, sizeof(ibv_flow_spec_eth), sizeof(ibv_flow_eth_filter),
             offsetof(ibv_flow_spec_eth, val), offsetof(ibv_flow_spec_eth, mask)};
      return true;
    case IBV_FLOW_SPEC_IPV4:
      // The short IPv4 spec is the extended one's first two fields.
      out = {FlowLayer::kIpv4, sizeof(ibv_flow_spec_ipv4), sizeof(ibv_flow_ipv4_filter),
             offsetof(ibv_flow_spec_ipv4, val), offsetof(ibv_flow_spec_ipv4, mask)};
      return true;
    case IBV_FLOW_SPEC_IPV4_EXT:
      out = {FlowLayer::kIpv4, sizeof(ibv_flow_spec_ipv4_ext), sizeof(ibv_flow_ipv4_ext_filter),
             offsetof(ibv_flow_spec_ipv4_ext, val), offsetof(ibv_flow_spec_ipv4_ext, mask)};
      return true;
    case IBV_FLOW_SPEC_IPV6:
      out = {FlowLayer::kIpv6, sizeof(ibv_flow_spec_ipv6), sizeof(ibv_flow_ipv6_filter),
             offsetof(ibv_flow_spec_ipv6, val), offsetof(ibv_flow_spec_ipv6, mask)};
      return true;
    case IBV_FLOW_SPEC_TCP:
    case IBV_FLOW_SPEC_UDP:
      out = {type == IBV_FLOW_SPEC_TCP ? FlowLayer::kTcp : FlowLayer::kUdp, sizeof(ibv_flow_spec_tcp_udp),
             sizeof(ibv_flow_tcp_udp_filter), offsetof(ibv_flow_spec_tcp_udp, val),
             offsetof(ibv_flow_spec_tcp_udp, mask)};
      return true;
    default:
      return false;
  }
}

// Types verbs defines that softhca does not steer on.
bool known_unsupported(uint32_t type) {
  if (type & kInnerBit) return true;
  switch (type) {
    case IBV_FLOW_SPEC_ESP:
    case IBV_FLOW_SPEC_VXLAN_TUNNEL:
    case IBV_FLOW_SPEC_GRE:
    case IBV_FLOW_SPEC_MPLS:
    case IBV_FLOW_SPEC_ACTION_TAG:
    case IBV_FLOW_SPEC_ACTION_DROP:
    case IBV_FLOW_SPEC_ACTION_HANDLE:
    case IBV_FLOW_SPEC_ACTION_COUNT:
      return true;
    default:
      return false;
  }
}

// The slot of a layer in the rule's "seen" bits: IPv4 and IPv6 share one,
// TCP and UDP another (a frame has one of each).
int slot_of(FlowLayer layer) {
  switch (layer) {
    case FlowLayer::kEth:
      return 0;
    case FlowLayer::kIpv4:
    case FlowLayer::kIpv6:
      return 1;
    case FlowLayer::kTcp:
    case FlowLayer::kUdp:
      return 2;
  }
  return 0;
}

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

bool masked_equal(const uint8_t* key, const FlowSpec& spec) {
  for (std::size_t i = 0; i < spec.key_bytes; ++i)
    if ((key[i] & spec.mask[i]) != spec.value[i]) return false;
  return true;
}

bool spec_matches(const FlowSpec& spec, const FrameKeys& keys) {
  switch (spec.layer) {
    case FlowLayer::kEth:
      return masked_equal(keys.eth.data(), spec);
    case FlowLayer::kIpv4:
      return keys.has_ipv4 && masked_equal(keys.ipv4.data(), spec);
    case FlowLayer::kIpv6:
      return keys.has_ipv6 && masked_equal(keys.ipv6.data(), spec);
    case FlowLayer::kTcp:
      return keys.has_tcp && masked_equal(keys.l4.data(), spec);
    case FlowLayer::kUdp:
      return keys.has_udp && masked_equal(keys.l4.data(), spec);
  }
  return false;
}

void add_once(std::vector<uint32_t>& out, std::size_t from, uint32_t qpn) {
  if (std::find(out.begin() + static_cast<std::ptrdiff_t>(from), out.end(), qpn) == out.end()) out.push_back(qpn);
}

}  // namespace

Result<FlowRule> parse_flow_rule(const ibv_flow_attr& attr) {
  if (attr.comp_mask != 0) return fail(std::errc::invalid_argument);
  const uint32_t type = flow_attr_type(attr);
  if (type > IBV_FLOW_ATTR_SNIFFER) return fail(std::errc::invalid_argument);
  if (attr.flags & IBV_FLOW_ATTR_FLAGS_EGRESS) return fail(std::errc::operation_not_supported);
  if ((attr.flags & ~static_cast<uint32_t>(IBV_FLOW_ATTR_FLAGS_DONT_TRAP)) != 0) return fail(std::errc::invalid_argument);
  // Only NORMAL rules may let a frame go on (ibv_create_flow(3), note 4).
  if ((attr.flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP) && type != IBV_FLOW_ATTR_NORMAL)
    return fail(std::errc::invalid_argument);
  if (attr.port != 1) return fail(std::errc::invalid_argument);
  if (type != IBV_FLOW_ATTR_NORMAL && attr.num_of_specs != 0) return fail(std::errc::invalid_argument);
  if (attr.num_of_specs > kMaxFlowSpecs) return fail(std::errc::invalid_argument);

  FlowRule rule;
  rule.type = static_cast<ibv_flow_attr_type>(type);
  rule.priority = attr.priority;
  rule.dont_trap = (attr.flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP) != 0;
  const auto* p = reinterpret_cast<const uint8_t*>(&attr + 1);
  unsigned seen = 0;
  for (int i = 0; i < attr.num_of_specs; ++i) {
    uint32_t spec_type = 0;
    uint16_t spec_size = 0;
    std::memcpy(&spec_type, p, sizeof spec_type);
    std::memcpy(&spec_size, p + offsetof(ibv_flow_spec_eth, size), sizeof spec_size);
    if (spec_size < offsetof(ibv_flow_spec_eth, val)) return fail(std::errc::invalid_argument);
    LayerInfo info{};
    if (!layer_of(spec_type, info))
      return fail(known_unsupported(spec_type) ? std::errc::operation_not_supported : std::errc::invalid_argument);
    if (spec_size < info.spec_bytes) return fail(std::errc::invalid_argument);
    // A longer spec (a newer struct) may only add fields left zero.
    for (std::size_t b = info.spec_bytes; b < spec_size; ++b)
      if (p[b] != 0) return fail(std::errc::operation_not_supported);
    const unsigned bit = 1u << slot_of(info.layer);
    if (seen & bit) return fail(std::errc::invalid_argument);
    seen |= bit;
    FlowSpec& spec = rule.specs[rule.num_specs++];
    spec.layer = info.layer;
    spec.key_bytes = static_cast<uint8_t>(info.key_bytes);
    std::memcpy(spec.mask.data(), p + info.mask_offset, info.key_bytes);
    std::memcpy(spec.value.data(), p + info.val_offset, info.key_bytes);
    for (std::size_t b = 0; b < info.key_bytes; ++b) spec.value[b] &= spec.mask[b];
    p += spec_size;
  }
  return rule;
}

bool parse_frame(std::span<const uint8_t> frame, FrameKeys& keys) {
  keys = FrameKeys{};
  if (frame.size() < 14) return false;
  const uint8_t* f = frame.data();
  ibv_flow_eth_filter eth{};
  std::memcpy(eth.dst_mac, f, 6);
  std::memcpy(eth.src_mac, f + 6, 6);
  keys.multicast = (f[0] & 1) != 0;
  std::size_t off = 12;
  uint16_t ether_type = be16(f + off);
  // 802.1Q / 802.1ad tags: the filter's tag is the outer one's TCI, its
  // ethertype the one after the last tag.
  for (int tags = 0; (ether_type == 0x8100 || ether_type == 0x88a8) && tags < 2; ++tags) {
    if (frame.size() < off + 6) break;
    if (tags == 0) std::memcpy(&eth.vlan_tag, f + off + 2, 2);
    off += 4;
    ether_type = be16(f + off);
  }
  std::memcpy(&eth.ether_type, f + off, 2);
  std::memcpy(keys.eth.data(), &eth, sizeof eth);
  off += 2;

  uint8_t l4_proto = 0;
  std::size_t l4_off = 0;
  if (ether_type == 0x0800 && frame.size() >= off + 20 && (f[off] >> 4) == 4) {
    const std::size_t ihl = std::size_t{f[off] & 0x0fu} * 4;
    if (ihl >= 20 && frame.size() >= off + ihl) {
      ibv_flow_ipv4_ext_filter ip{};
      std::memcpy(&ip.src_ip, f + off + 12, 4);
      std::memcpy(&ip.dst_ip, f + off + 16, 4);
      ip.proto = f[off + 9];
      ip.tos = f[off + 1];
      ip.ttl = f[off + 8];
      ip.flags = static_cast<uint8_t>(f[off + 6] >> 5);
      std::memcpy(keys.ipv4.data(), &ip, sizeof ip);
      keys.has_ipv4 = true;
      // Only the first fragment carries the ports.
      const bool first_fragment = (be16(f + off + 6) & 0x1fff) == 0;
      if (first_fragment) {
        l4_proto = ip.proto;
        l4_off = off + ihl;
      }
    }
  } else if (ether_type == 0x86dd && frame.size() >= off + 40 && (f[off] >> 4) == 6) {
    ibv_flow_ipv6_filter ip{};
    std::memcpy(ip.src_ip, f + off + 8, 16);
    std::memcpy(ip.dst_ip, f + off + 24, 16);
    const uint32_t word = uint32_t{f[off]} << 24 | uint32_t{f[off + 1]} << 16 | uint32_t{f[off + 2]} << 8 | f[off + 3];
    const uint32_t label = word & 0xfffffu;
    const uint8_t label_be[4] = {static_cast<uint8_t>(label >> 24), static_cast<uint8_t>(label >> 16),
                                 static_cast<uint8_t>(label >> 8), static_cast<uint8_t>(label)};
    std::memcpy(&ip.flow_label, label_be, 4);
    ip.traffic_class = static_cast<uint8_t>(word >> 20);
    ip.next_hdr = f[off + 6];
    ip.hop_limit = f[off + 7];
    std::memcpy(keys.ipv6.data(), &ip, sizeof ip);
    keys.has_ipv6 = true;
    l4_proto = ip.next_hdr;
    l4_off = off + 40;
  }
  if ((l4_proto == 6 || l4_proto == 17) && l4_off != 0 && frame.size() >= l4_off + 4) {
    ibv_flow_tcp_udp_filter ports{};
    std::memcpy(&ports.src_port, f + l4_off, 2);
    std::memcpy(&ports.dst_port, f + l4_off + 2, 2);
    std::memcpy(keys.l4.data(), &ports, sizeof ports);
    keys.has_tcp = l4_proto == 6;
    keys.has_udp = l4_proto == 17;
  }
  return true;
}

bool rule_matches(const FlowRule& rule, const FrameKeys& keys) {
  switch (rule.type) {
    case IBV_FLOW_ATTR_SNIFFER:
    case IBV_FLOW_ATTR_ALL_DEFAULT:
      return true;
    case IBV_FLOW_ATTR_MC_DEFAULT:
      return keys.multicast;
    default:
      break;
  }
  for (int i = 0; i < rule.num_specs; ++i)
    if (!spec_matches(rule.specs[i], keys)) return false;
  return true;
}

uint32_t toeplitz_hash(std::span<const uint8_t, kRxHashKeyBytes> key, std::span<const uint8_t> input) {
  // The 32-bit window of the key at bit i is XORed in for every set bit i
  // of the input, most significant bit first.
  uint32_t result = 0;
  uint32_t window = uint32_t{key[0]} << 24 | uint32_t{key[1]} << 16 | uint32_t{key[2]} << 8 | key[3];
  std::size_t next = 4;  // the key byte that slides in next
  for (const uint8_t byte : input) {
    const uint8_t incoming = next < key.size() ? key[next] : 0;
    ++next;
    for (int bit = 7; bit >= 0; --bit) {
      if (byte & (1u << bit)) result ^= window;
      window = window << 1 | ((incoming >> bit) & 1u);
    }
  }
  return result;
}

uint32_t rx_hash(const RxHash& hash, const FrameKeys& keys) {
  uint8_t input[36];
  std::size_t n = 0;
  auto put = [&](const uint8_t* p, std::size_t bytes) {
    std::memcpy(input + n, p, bytes);
    n += bytes;
  };
  if (keys.has_ipv4) {
    if (hash.fields & IBV_RX_HASH_SRC_IPV4) put(keys.ipv4.data() + offsetof(ibv_flow_ipv4_ext_filter, src_ip), 4);
    if (hash.fields & IBV_RX_HASH_DST_IPV4) put(keys.ipv4.data() + offsetof(ibv_flow_ipv4_ext_filter, dst_ip), 4);
  } else if (keys.has_ipv6) {
    if (hash.fields & IBV_RX_HASH_SRC_IPV6) put(keys.ipv6.data() + offsetof(ibv_flow_ipv6_filter, src_ip), 16);
    if (hash.fields & IBV_RX_HASH_DST_IPV6) put(keys.ipv6.data() + offsetof(ibv_flow_ipv6_filter, dst_ip), 16);
  }
  uint64_t src_port = 0;
  uint64_t dst_port = 0;
  if (keys.has_tcp) {
    src_port = IBV_RX_HASH_SRC_PORT_TCP;
    dst_port = IBV_RX_HASH_DST_PORT_TCP;
  } else if (keys.has_udp) {
    src_port = IBV_RX_HASH_SRC_PORT_UDP;
    dst_port = IBV_RX_HASH_DST_PORT_UDP;
  }
  if (hash.fields & src_port) put(keys.l4.data() + offsetof(ibv_flow_tcp_udp_filter, src_port), 2);
  if (hash.fields & dst_port) put(keys.l4.data() + offsetof(ibv_flow_tcp_udp_filter, dst_port), 2);
  return toeplitz_hash(hash.key, std::span<const uint8_t>(input, n));
}

uint32_t FlowTable::receiver(const Entry& e, const FrameKeys& keys) {
  const std::vector<uint32_t>& spread = e.target.spread;
  if (spread.empty()) return e.target.qpn;
  return spread[rx_hash(e.target.hash, keys) & (spread.size() - 1)];
}

void FlowTable::add(uint64_t id, FlowTarget target, const FlowRule& rule) {
  // Keep NORMAL rules in priority order (others anywhere: they are not ordered).
  auto at = std::upper_bound(entries_.begin(), entries_.end(), rule.priority,
                             [](uint16_t prio, const Entry& e) { return prio < e.rule.priority; });
  entries_.insert(at, Entry{id, std::move(target), rule});
}

bool FlowTable::remove(uint64_t id) {
  auto it = std::find_if(entries_.begin(), entries_.end(), [id](const Entry& e) { return e.id == id; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

void FlowTable::select(const FrameKeys& keys, uint32_t sender_qpn, std::vector<uint32_t>& out) const {
  const std::size_t base = out.size();
  auto take = [&](const Entry& e) {
    if (e.target.qpn != sender_qpn) add_once(out, base, receiver(e, keys));
  };
  for (const Entry& e : entries_)
    if (e.rule.type == IBV_FLOW_ATTR_SNIFFER) take(e);

  bool steered = false;
  for (std::size_t i = 0; i < entries_.size();) {
    // One priority level: [i, end).
    std::size_t end = i;
    while (end < entries_.size() && entries_[end].rule.priority == entries_[i].rule.priority) ++end;
    bool trapped = false;
    for (std::size_t k = i; k < end; ++k) {
      const Entry& e = entries_[k];
      if (e.rule.type != IBV_FLOW_ATTR_NORMAL || !rule_matches(e.rule, keys)) continue;
      steered = true;
      if (!e.rule.dont_trap) trapped = true;
      take(e);
    }
    if (trapped) break;
    i = end;
  }
  if (steered) return;
  for (const Entry& e : entries_) {
    if (e.rule.type == IBV_FLOW_ATTR_ALL_DEFAULT || (e.rule.type == IBV_FLOW_ATTR_MC_DEFAULT && keys.multicast))
      take(e);
  }
}

}  // namespace softhca::transport
