#include "engine/device/device_info.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/log.hpp"

namespace softhca::engine {
namespace {

// Sort classes of the GID table, in table order.
// The table's order, as a RoCE NIC lists its netdev's addresses: the
// interfaces' IPv4, then their IPv6, and the loopback addresses (which no
// NIC has, but a namespace with nothing else needs) last. A stack that takes
// the first usable RoCE v2 IPv4 GID (UCX does) then picks an address that
// other hosts can reach, never 127.0.0.1.
enum class GidClass { kV4Other, kV6Other, kV4Localhost, kV4Loopback, kV6Localhost };

bool is_ipv4_mapped(const GidBytes& raw) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(raw.data(), kPrefix, sizeof kPrefix) == 0;
}

struct Candidate {
  GidClass cls;
  GidEntry entry;
};

std::optional<Candidate> classify(const InterfaceAddress& a) {
  Candidate c{GidClass::kV4Other, GidEntry{}};
  c.entry.type = GidType::kRoceV2;
  c.entry.ifindex = a.ifindex;
  c.entry.ifname = a.ifname;
  c.entry.mtu = a.mtu != 0 ? roce_mtu_for(a.mtu) : 0;
  if (a.family == AF_INET) {
    const std::span<const uint8_t, 4> v4(a.address.data(), 4);
    if (v4[0] == 0 && v4[1] == 0 && v4[2] == 0 && v4[3] == 0) return std::nullopt;
    c.entry.raw = ipv4_mapped_gid(v4);
    if (c.entry.raw == kLoopbackV4Gid)
      c.cls = GidClass::kV4Localhost;
    else if (v4[0] == 127)
      c.cls = GidClass::kV4Loopback;
    else
      c.cls = GidClass::kV4Other;
    return c;
  }
  if (a.family == AF_INET6) {
    c.entry.raw = a.address;
    // The unspecified address is no GID; a v4-mapped one would duplicate its IPv4 entry.
    if (is_zero_gid(c.entry.raw) || is_ipv4_mapped(c.entry.raw)) return std::nullopt;
    c.cls = c.entry.raw == kLoopbackV6Gid ? GidClass::kV6Localhost : GidClass::kV6Other;
    return c;
  }
  return std::nullopt;
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

std::string first_line_of(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string format_gid(const GidBytes& raw) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, raw.data(), text, sizeof text) == nullptr) return "?";
  return text;
}

DeviceInfo probe_device_info() {
  DeviceInfo info = make_device_info(read_interface_addresses(), read_guid_seed());
  if (log_enabled(LogLevel::kDebug)) {
    SOFTHCA_DEBUG("device %s node guid 0x%016llx, %zu gids, active mtu %u", info.name.c_str(),
                  static_cast<unsigned long long>(info.node_guid), info.gids.size(), info.active_mtu_bytes);
    for (std::size_t i = 0; i < info.gids.size(); ++i)
      SOFTHCA_DEBUG("gid %zu %s on %s (ifindex %u)", i, format_gid(info.gids[i].raw).c_str(),
                    info.gids[i].ifname.c_str(), info.gids[i].ifindex);
  }
  return info;
}

}  // namespace

GidBytes ipv4_mapped_gid(std::span<const uint8_t, 4> ipv4) {
  GidBytes raw{};
  raw[10] = 0xff;
  raw[11] = 0xff;
  std::copy(ipv4.begin(), ipv4.end(), raw.begin() + 12);
  return raw;
}

bool is_zero_gid(std::span<const uint8_t, 16> raw) {
  return std::all_of(raw.begin(), raw.end(), [](uint8_t b) { return b == 0; });
}

std::vector<GidEntry> build_gid_table(std::span<const InterfaceAddress> addresses, std::size_t max_entries) {
  std::vector<Candidate> candidates;
  candidates.reserve(addresses.size() + 1);
  bool have_localhost = false;
  uint32_t lo_ifindex = 0;
  for (const InterfaceAddress& a : addresses) {
    if (a.ifname == "lo" && lo_ifindex == 0) lo_ifindex = a.ifindex;
    if (auto c = classify(a)) {
      have_localhost |= c->cls == GidClass::kV4Localhost;
      candidates.push_back(std::move(*c));
    }
  }
  if (!have_localhost) {
    // 127.0.0.1 is always in the table: rdma_cm on 127.0.0.1 must find it
    // even in a namespace whose lo has no address, and with no other
    // address it is index 0, so that -g 0 / -x 0 work everywhere.
    Candidate c{GidClass::kV4Localhost, GidEntry{kLoopbackV4Gid, GidType::kRoceV2, lo_ifindex, "lo"}};
    candidates.push_back(std::move(c));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
    if (x.cls != y.cls) return x.cls < y.cls;
    return x.entry.ifindex < y.entry.ifindex;
  });

  std::vector<GidEntry> table;
  table.reserve(std::min(candidates.size(), max_entries));
  std::optional<GidEntry> localhost;
  for (Candidate& c : candidates) {
    if (c.cls == GidClass::kV4Localhost && !localhost) localhost = c.entry;
    if (table.size() >= max_entries) continue;
    const bool duplicate =
        std::any_of(table.begin(), table.end(), [&](const GidEntry& e) { return e.raw == c.entry.raw; });
    if (!duplicate) table.push_back(std::move(c.entry));
  }
  // A host with more addresses than the table holds still has 127.0.0.1,
  // in the last entry.
  if (localhost && max_entries > 0 &&
      std::none_of(table.begin(), table.end(), [](const GidEntry& e) { return e.raw == kLoopbackV4Gid; }))
    table.back() = *localhost;
  return table;
}

uint64_t derive_node_guid(std::string_view seed) {
  uint64_t guid = mix64(fnv1a64(seed));
  if (guid == 0) guid = 0x50f7c0de00000001ULL;
  return guid;
}

const GidEntry* DeviceInfo::gid_at(uint32_t index) const {
  if (index >= gids.size()) return nullptr;
  const GidEntry& e = gids[index];
  return is_zero_gid(e.raw) ? nullptr : &e;
}

std::optional<uint32_t> DeviceInfo::find_gid_index(std::span<const uint8_t, 16> raw) const {
  if (is_zero_gid(raw)) return std::nullopt;
  for (std::size_t i = 0; i < gids.size(); ++i)
    if (std::equal(raw.begin(), raw.end(), gids[i].raw.begin())) return static_cast<uint32_t>(i);
  return std::nullopt;
}

DeviceInfo make_device_info(std::span<const InterfaceAddress> addresses, std::string_view guid_seed) {
  DeviceInfo info;
  info.name = std::string(kDeviceName);
  info.node_guid = derive_node_guid(guid_seed);
  info.sys_image_guid = info.node_guid;
  info.gids = build_gid_table(addresses);
  info.active_mtu_bytes = active_mtu_for(addresses);
  return info;
}

uint32_t roce_mtu_for(uint32_t interface_mtu) {
  // IPv6 (40) + UDP (8) + BTH (12) + the largest extended headers of a data
  // packet (RETH 16 + ImmDt 4, or AtomicETH 28) + ICRC (4), rounded up.
  constexpr uint32_t kOverhead = 96;
  for (uint32_t mtu = limits::kMtuBytes; mtu > 256; mtu /= 2)
    if (mtu + kOverhead <= interface_mtu) return mtu;
  return 256;
}

uint32_t active_mtu_for(std::span<const InterfaceAddress> addresses) {
  uint32_t mtu = 0;
  for (const InterfaceAddress& a : addresses) {
    if (a.loopback || !a.up || a.mtu == 0) continue;
    const uint32_t m = roce_mtu_for(a.mtu);
    if (mtu == 0 || m < mtu) mtu = m;
  }
  return mtu == 0 ? limits::kMtuBytes : mtu;
}

namespace {

uint32_t interface_mtu(const std::string& name) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ifreq req{};
  std::strncpy(req.ifr_name, name.c_str(), IFNAMSIZ - 1);
  const int rc = ::ioctl(fd, SIOCGIFMTU, &req);
  ::close(fd);
  return rc == 0 && req.ifr_mtu > 0 ? static_cast<uint32_t>(req.ifr_mtu) : 0;
}

}  // namespace

std::vector<InterfaceAddress> read_interface_addresses() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    SOFTHCA_WARN("getifaddrs failed (errno %d): the gid table holds only 127.0.0.1", errno);
    return out;
  }
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_name == nullptr) continue;
    InterfaceAddress a;
    a.family = ifa->ifa_addr->sa_family;
    if (a.family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
      std::memcpy(a.address.data(), &sin->sin_addr, 4);
    } else if (a.family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      std::memcpy(a.address.data(), &sin6->sin6_addr, 16);
    } else {
      continue;
    }
    // IPv4 aliases carry a label ("eth0:1"); the netdev is the part before ':'.
    std::string_view name(ifa->ifa_name);
    a.ifname = std::string(name.substr(0, name.find(':')));
    a.ifindex = if_nametoindex(a.ifname.c_str());
    a.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    a.up = (ifa->ifa_flags & IFF_UP) != 0;
    a.mtu = interface_mtu(a.ifname);
    out.push_back(std::move(a));
  }
  freeifaddrs(list);
  return out;
}

std::string read_guid_seed() {
  std::string seed = first_line_of("/etc/machine-id");
  if (seed.empty()) seed = first_line_of("/var/lib/dbus/machine-id");
  if (seed.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) seed = host;
  }
  // A network namespace is a host of its own (system tests run peers in netns):
  // mix in its identity so that each gets its own GUID.
  char ns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  if (n > 0) {
    seed += '/';
    seed.append(ns, static_cast<std::size_t>(n));
  }
  return seed;
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = probe_device_info();
  return info;
}

std::optional<uint32_t> find_gid_index(std::span<const uint8_t, 16> raw) { return device_info().find_gid_index(raw); }

bool is_local_gid(std::span<const uint8_t, 16> raw) { return device_info().is_local_gid(raw); }

}  // namespace softhca::engine
