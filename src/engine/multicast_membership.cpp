#include "engine/multicast_membership.hpp"

#include <algorithm>
#include <cstring>

namespace softhca::engine {
namespace {

bool is_mapped(const uint8_t* gid) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid, kPrefix, sizeof kPrefix) == 0;
}

bool is_loopback_address(const GidBytes& raw) {
  return (is_mapped(raw.data()) && raw[12] == 127) || raw == kLoopbackV6Gid;
}

// Interfaces that carry a loopback address: what is sent there stays on this host.
bool is_loopback_interface(std::span<const GidEntry> gids, uint32_t ifindex) {
  return std::any_of(gids.begin(), gids.end(),
                     [&](const GidEntry& g) { return g.ifindex == ifindex && is_loopback_address(g.raw); });
}

}  // namespace

std::vector<uint32_t> group_interfaces(std::span<const GidEntry> gids, const uint8_t* mgid) {
  std::vector<uint32_t> out;
  for (const GidEntry& g : gids) {
    if (g.ifindex == 0 || is_mapped(g.raw.data()) != is_mapped(mgid)) continue;
    if (is_loopback_interface(gids, g.ifindex) || std::find(out.begin(), out.end(), g.ifindex) != out.end()) continue;
    out.push_back(g.ifindex);
  }
  return out;
}

std::vector<uint32_t> group_interfaces(std::span<const GidEntry> gids, const uint8_t* mgid, uint32_t ifindex) {
  const auto all = group_interfaces(gids, mgid);
  if (std::find(all.begin(), all.end(), ifindex) == all.end()) return {};
  return {ifindex};
}

void MulticastMembership::add(const uint8_t* mgid, uint32_t qpn, std::span<const uint32_t> interfaces) {
  std::lock_guard guard(mutex_);
  Joined joined{{}, qpn, {interfaces.begin(), interfaces.end()}};
  std::memcpy(joined.mgid.data(), mgid, 16);
  if (std::any_of(joined_.begin(), joined_.end(),
                  [&](const Joined& j) { return j.qpn == qpn && j.mgid == joined.mgid; }))
    return;
  for (const uint32_t ifindex : joined.interfaces) link_.join_group(mgid, ifindex);
  joined_.push_back(std::move(joined));
}

void MulticastMembership::leave_locked(const Joined& joined) {
  for (const uint32_t ifindex : joined.interfaces) link_.leave_group(joined.mgid.data(), ifindex);
}

void MulticastMembership::remove(const uint8_t* mgid, uint32_t qpn) {
  std::lock_guard guard(mutex_);
  std::erase_if(joined_, [&](const Joined& j) {
    if (j.qpn != qpn || std::memcmp(j.mgid.data(), mgid, 16) != 0) return false;
    leave_locked(j);
    return true;
  });
}

void MulticastMembership::remove_qp(uint32_t qpn) {
  std::lock_guard guard(mutex_);
  std::erase_if(joined_, [&](const Joined& j) {
    if (j.qpn != qpn) return false;
    leave_locked(j);
    return true;
  });
}

}  // namespace softhca::engine
