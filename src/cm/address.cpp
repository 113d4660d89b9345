#include "cm/address.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

namespace softhca::cm {
namespace {

constexpr Gid kV4Prefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};

bool v4_mapped(const Gid& g) { return std::equal(g.begin(), g.begin() + 12, kV4Prefix.begin()); }

}  // namespace

bool IpAddress::wildcard() const {
  if (family == AF_INET) return addr[12] == 0 && addr[13] == 0 && addr[14] == 0 && addr[15] == 0;
  return std::all_of(addr.begin(), addr.end(), [](uint8_t b) { return b == 0; });
}

bool IpAddress::loopback() const {
  if (family == AF_INET) return addr[12] == 127;
  if (family == AF_INET6) {
    if (v4_mapped(addr)) return addr[12] == 127;
    return addr == engine::kLoopbackV6Gid;
  }
  return false;
}

Result<IpAddress> from_sockaddr(const sockaddr* sa, socklen_t len) {
  if (sa == nullptr) return fail(std::errc::invalid_argument);
  IpAddress ip;
  if (sa->sa_family == AF_INET) {
    if (len < static_cast<socklen_t>(sizeof(sockaddr_in))) return fail(std::errc::invalid_argument);
    sockaddr_in sin;
    std::memcpy(&sin, sa, sizeof sin);
    ip.family = AF_INET;
    ip.addr = kV4Prefix;
    std::memcpy(ip.addr.data() + 12, &sin.sin_addr, 4);
    ip.port = ntohs(sin.sin_port);
    return ip;
  }
  if (sa->sa_family == AF_INET6) {
    if (len < static_cast<socklen_t>(sizeof(sockaddr_in6))) return fail(std::errc::invalid_argument);
    sockaddr_in6 sin6;
    std::memcpy(&sin6, sa, sizeof sin6);
    ip.family = AF_INET6;
    std::memcpy(ip.addr.data(), &sin6.sin6_addr, 16);
    ip.port = ntohs(sin6.sin6_port);
    ip.scope_id = sin6.sin6_scope_id;
    return ip;
  }
  return fail(std::errc::address_family_not_supported);
}

Result<IpAddress> from_sockaddr(const sockaddr* sa) {
  if (sa == nullptr) return fail(std::errc::invalid_argument);
  if (sa->sa_family == AF_INET) return from_sockaddr(sa, sizeof(sockaddr_in));
  if (sa->sa_family == AF_INET6) return from_sockaddr(sa, sizeof(sockaddr_in6));
  return fail(std::errc::address_family_not_supported);
}

socklen_t to_sockaddr(const IpAddress& ip, sockaddr_storage& out) {
  std::memset(&out, 0, sizeof out);
  if (ip.family == AF_INET) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(ip.port);
    std::memcpy(&sin.sin_addr, ip.addr.data() + 12, 4);
    std::memcpy(&out, &sin, sizeof sin);
    return sizeof sin;
  }
  if (ip.family == AF_INET6) {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(ip.port);
    sin6.sin6_scope_id = ip.scope_id;
    std::memcpy(&sin6.sin6_addr, ip.addr.data(), 16);
    std::memcpy(&out, &sin6, sizeof sin6);
    return sizeof sin6;
  }
  return 0;
}

IpAddress wildcard_of(uint8_t family) {
  IpAddress ip;
  ip.family = family;
  if (family == AF_INET) ip.addr = kV4Prefix;
  return ip;
}

std::string to_string(const IpAddress& ip) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ip.family == AF_INET) {
    inet_ntop(AF_INET, ip.addr.data() + 12, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ip.port);
  }
  inet_ntop(AF_INET6, ip.addr.data(), buf, sizeof buf);
  return "[" + std::string(buf) + "]:" + std::to_string(ip.port);
}

BindKey bind_key(uint16_t ps, const IpAddress& ip) {
  BindKey k;
  k.ps = ps;
  k.port = ip.port;
  k.family = ip.family;
  k.wildcard = ip.wildcard();
  // An IPv4-mapped IPv6 address names the same IPv4 host: compare them alike.
  k.addr = ip.addr;
  if (ip.family == AF_INET6 && v4_mapped(ip.addr)) k.family = AF_INET;
  return k;
}

std::optional<uint32_t> local_gid_index(const IpAddress& ip, const engine::DeviceInfo& dev) {
  if (ip.family != AF_INET && ip.family != AF_INET6) return std::nullopt;
  if (auto idx = dev.find_gid_index(std::span<const uint8_t, 16>(ip.addr))) return *idx;
  if (ip.loopback()) {
    if (auto idx = dev.find_gid_index(std::span<const uint8_t, 16>(engine::kLoopbackV4Gid))) return *idx;
  }
  return std::nullopt;
}

}  // namespace softhca::cm
