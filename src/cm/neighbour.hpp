// The two rtnetlink questions address resolution asks the kernel about a
// destination on another host: which next hop the route to it goes through
// (RTM_GETROUTE: the gateway, or the destination itself when on-link, and
// the interface), and in what state the neighbour entry of that next hop is
// (RTM_GETNEIGH for one entry). The kernel's ib_addr calls an address
// resolved only once that entry is valid (drivers/infiniband/core/addr.c,
// dst_fetch_ha); softhca asks the same of the kernel from user space.
//
// Pure: builds request bytes and parses reply bytes; the sockets are
// cm/kernel_neighbour.cpp's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cm/address.hpp"
#include "common/result.hpp"

namespace softhca::cm::neighbour {

// What a neighbour entry's NUD state means for a resolution waiting on it.
enum class Verdict {
  kValid,      // REACHABLE, STALE, DELAY, PROBE, PERMANENT, NOARP (the kernel's NUD_VALID)
  kResolving,  // INCOMPLETE: the kernel is asking (ARP / neighbour solicitation)
  kIdle,       // no entry (NONE) or FAILED: nobody asks until a packet goes there
};
Verdict judge(uint16_t nud_state);

struct NextHop {
  int ifindex = 0;
  IpAddress addr;      // the gateway (of either family), or the destination itself when on-link
  bool local = false;  // the route leads to this host (RTN_LOCAL): no neighbour to ask
};

// RTM_GETROUTE for `dst` (its family and address, and for a scoped IPv6
// address its interface; the port is ignored).
std::vector<uint8_t> route_request(const IpAddress& dst, uint32_t seq);
// The answer to route_request(dst, seq). Errors: the kernel's own (an
// NLMSG_ERROR, e.g. network_unreachable), bad_message (truncated or no
// RTM_NEWROUTE for `seq`, or a route without an output interface).
Result<NextHop> parse_route_reply(std::span<const uint8_t> reply, uint32_t seq, const IpAddress& dst);

// RTM_GETNEIGH for one entry: the next hop's address on its interface.
std::vector<uint8_t> neighbour_request(const NextHop& hop, uint32_t seq);
// The NUD state of the entry asked for; NUD_NONE when the kernel has none
// (ENOENT). Errors: the kernel's own, bad_message.
Result<uint16_t> parse_neighbour_reply(std::span<const uint8_t> reply, uint32_t seq);

}  // namespace softhca::cm::neighbour
