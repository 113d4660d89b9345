// IP addresses as rdma_cm sees them, and how they map onto softhca0's port 1.
//
// Local reachability: a destination is on this host when it is one of its
// addresses — any 127.0.0.0/8 address, ::1, or an address in the device's
// GID table (every interface address, engine/device). Its GID is the table
// entry for the address; 127/8 addresses that are not in the table (only
// 127.0.0.1 usually is) and ::1 without an entry use the ::ffff:127.0.0.1
// entry, as the kernel routes them all through `lo`. Anything else is
// another host's, which the service resolves through the kernel's route and
// neighbour tables (service_addressing.cpp) and reaches over the udp link.
//
// Pure functions over a DeviceInfo; no I/O.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cm/port_table.hpp"
#include "cm/mad_codec.hpp"
#include "engine/device/device_info.hpp"

namespace softhca::cm {

struct IpAddress {
  uint8_t family = 0;  // AF_INET or AF_INET6; 0 = none
  Gid addr{};          // IPv4: ::ffff:a.b.c.d
  uint16_t port = 0;   // host order
  uint32_t scope_id = 0;

  bool wildcard() const;
  bool loopback() const;
  bool operator==(const IpAddress&) const = default;
};

// Errors: address_family_not_supported (not AF_INET/AF_INET6),
// invalid_argument (length too short).
Result<IpAddress> from_sockaddr(const sockaddr* sa, socklen_t len);
// Like from_sockaddr, with the length implied by the family (rdma_cm's API
// passes no length).
Result<IpAddress> from_sockaddr(const sockaddr* sa);
// Writes the address into `out` (a sockaddr_in or sockaddr_in6); returns its length.
socklen_t to_sockaddr(const IpAddress& ip, sockaddr_storage& out);
// The wildcard of a family, e.g. to bind before resolving.
IpAddress wildcard_of(uint8_t family);
// "127.0.0.1:7174", "[::1]:7174"
std::string to_string(const IpAddress& ip);

BindKey bind_key(uint16_t ps, const IpAddress& ip);

// The GID table index an address uses as a source or destination on this
// host, or nullopt when the address is not local (see above).
std::optional<uint32_t> local_gid_index(const IpAddress& ip, const engine::DeviceInfo& dev);

}  // namespace softhca::cm
