// Multicast between hosts: which IP multicast groups this process has joined
// on the network for its attached UD QPs. A QP attached to a group (its MGID
// is the group's IPv4-mapped or IPv6 address, as RoCEv2 maps them) makes the
// process join that group on the interfaces the attachment names; the last
// QP to leave a group on an interface leaves it there (the link counts the
// joins per group and interface). Delivery on this host needs none of this:
// the host registry's group table serves it over shared memory.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine/device/device_info.hpp"
#include "link/link.hpp"

namespace softhca::engine {

// The interfaces a group is joined on for a QP attached with ibv_attach_mcast,
// which names no address: every interface with a GID of the group's IP
// version, loopback excepted (nothing reaches another host through it).
std::vector<uint32_t> group_interfaces(std::span<const GidEntry> gids, const uint8_t* mgid);
// The same when the attachment comes with an interface (rdma_join_multicast's
// id is bound to an address): that one, unless it is loopback or unknown.
std::vector<uint32_t> group_interfaces(std::span<const GidEntry> gids, const uint8_t* mgid, uint32_t ifindex);

class MulticastMembership {
 public:
  explicit MulticastMembership(link::Link& link) : link_(link) {}
  // QP `qpn` was attached to `mgid`; joins it on `interfaces` (a second add
  // for the same QP and group changes nothing, as attaching twice does not).
  void add(const uint8_t* mgid, uint32_t qpn, std::span<const uint32_t> interfaces);
  // QP `qpn` left `mgid` (or every group, when it is destroyed).
  void remove(const uint8_t* mgid, uint32_t qpn);
  void remove_qp(uint32_t qpn);

 private:
  struct Joined {
    GidBytes mgid;
    uint32_t qpn;
    std::vector<uint32_t> interfaces;
  };
  void leave_locked(const Joined& joined);

  link::Link& link_;
  std::mutex mutex_;
  std::vector<Joined> joined_;
};

}  // namespace softhca::engine
