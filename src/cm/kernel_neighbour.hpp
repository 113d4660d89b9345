// Asking this host's kernel about the neighbour a destination is reached
// through, and making it find out (cm/neighbour.hpp has the messages).
// Neither needs privileges: rtnetlink GET requests are open to every user,
// and the kernel resolves a neighbour for any datagram sent its way.
#pragma once

#include <optional>

#include "cm/address.hpp"
#include "cm/neighbour.hpp"

namespace softhca::cm {

// The state of the entry of the next hop towards `dst` (on another host).
// kValid as well where the kernel cannot say (a route without one interface,
// a kernel without RTM_GETNEIGH for one entry, netlink unavailable): the
// address is then resolved as soon as a route exists, as before softhca
// asked. Thread: any; a few syscalls, none waits on the network.
neighbour::Verdict next_hop_state(const IpAddress& dst);

// Sends one datagram towards `dst` (from `src` when given) so that the
// kernel starts resolving the next hop's link-layer address.
void nudge_neighbour(const IpAddress& dst, const std::optional<IpAddress>& src);

}  // namespace softhca::cm
