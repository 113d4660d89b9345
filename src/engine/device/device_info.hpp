// The one softhca device of this host: its name, node GUID and RoCEv2 GID table.
//
// The table is built once, from the host's interface addresses, by a pure
// function (build_gid_table) so that its ordering rules can be tested without
// the machine's interfaces. device_info() is the device registry, the one
// global softhca keeps: built on first use, immutable afterwards.
//
// GID table ordering (index = position):
//   1. ::ffff:127.0.0.1 (always present: shm reaches loopback even if lo is down)
//   2. other IPv4 loopback addresses (127/8)
//   3. other IPv4 addresses, by interface index
//   4. ::1
//   5. other IPv6 addresses, by interface index
// Within one interface the kernel's address order is kept (primary first).
// Duplicates are dropped; the table is cut at limits::kGidTableLen.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/limits.hpp"

namespace softhca::engine {

using GidBytes = std::array<uint8_t, 16>;

// Values of the public enum ibv_gid_type (struct ibv_gid_entry.gid_type).
enum class GidType : uint32_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };

struct GidEntry {
  GidBytes raw{};
  GidType type = GidType::kRoceV2;
  uint32_t ifindex = 0;  // 0 when no netdev backs the entry
  std::string ifname;
  uint32_t mtu = 0;      // the largest IB MTU (bytes) of the interface's RoCEv2 packets; 0 unknown
};

// One address of a local interface, as getifaddrs reports it.
struct InterfaceAddress {
  int family = 0;       // AF_INET or AF_INET6; anything else is ignored
  GidBytes address{};   // AF_INET: the first 4 bytes, network order
  uint32_t ifindex = 0;
  std::string ifname;
  uint32_t mtu = 0;        // the interface's IP MTU; 0 if unknown
  bool loopback = false;   // IFF_LOOPBACK
  bool up = true;          // IFF_UP
};

// ::ffff:a.b.c.d
GidBytes ipv4_mapped_gid(std::span<const uint8_t, 4> ipv4);
inline constexpr GidBytes kLoopbackV4Gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
inline constexpr GidBytes kLoopbackV6Gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

bool is_zero_gid(std::span<const uint8_t, 16> raw);

// Pure: the GID table for these addresses (see the ordering above).
std::vector<GidEntry> build_gid_table(std::span<const InterfaceAddress> addresses,
                                      std::size_t max_entries = limits::kGidTableLen);

// Pure: the largest IB MTU (256 ... 4096 bytes) whose RoCEv2 packets fit an
// interface MTU of `interface_mtu` (IP, UDP, the transport headers and the
// ICRC around it), as RoCE NICs and rxe derive it: 1500 -> 1024, 9000 -> 4096.
uint32_t roce_mtu_for(uint32_t interface_mtu);

// Pure: the port's active MTU in bytes: the smallest RoCE MTU of the up,
// non-loopback interfaces that have addresses (packets to other hosts leave
// through them), or 4096 when there are none (loopback alone).
uint32_t active_mtu_for(std::span<const InterfaceAddress> addresses);

// Pure: a stable, never-zero node GUID (host byte order) from a per-host seed.
uint64_t derive_node_guid(std::string_view seed);

struct DeviceInfo {
  std::string name;
  uint64_t node_guid = 0;       // host byte order; the verbs report it big-endian
  uint64_t sys_image_guid = 0;  // host byte order
  std::vector<GidEntry> gids;   // gids[i] is GID index i; indexes past the end are empty
  uint32_t active_mtu_bytes = limits::kMtuBytes;  // the port's active MTU

  // nullptr for an empty or out-of-range index.
  const GidEntry* gid_at(uint32_t index) const;
  std::optional<uint32_t> find_gid_index(std::span<const uint8_t, 16> raw) const;
  bool is_local_gid(std::span<const uint8_t, 16> raw) const { return find_gid_index(raw).has_value(); }
};

inline constexpr std::string_view kDeviceName = "softhca0";

// Pure: the device for these addresses and GUID seed.
DeviceInfo make_device_info(std::span<const InterfaceAddress> addresses, std::string_view guid_seed);

// Reads the machine: getifaddrs, and /etc/machine-id (or the hostname) for the GUID.
std::vector<InterfaceAddress> read_interface_addresses();
std::string read_guid_seed();

// IBV_MTU_256 ... IBV_MTU_4096 (1 ... 5) for 256 ... 4096 bytes.
constexpr int mtu_enum(uint32_t bytes) {
  int e = 1;
  while (e < 5 && (128u << (e + 1)) <= bytes) ++e;
  return e;
}

// The device of this host, built on first call (thread-safe), then immutable.
const DeviceInfo& device_info();

// Shorthands over device_info(), for the data path (is an AH's dgid on this host?).
std::optional<uint32_t> find_gid_index(std::span<const uint8_t, 16> raw);
bool is_local_gid(std::span<const uint8_t, 16> raw);

}  // namespace softhca::engine
