// Handles for CM peers on other hosts: never a pid, stable per address pair.
#include <gtest/gtest.h>

#include "cm/remote_transport.hpp"

namespace softhca::cm {
namespace {

Gid v4(uint8_t last) {
  Gid g{};
  g[10] = g[11] = 0xff;
  g[12] = 198;
  g[13] = 18;
  g[15] = last;
  return g;
}

TEST(RemotePeers, HandlesAreStablePerPairAndNeverPids) {
  RemotePeers peers;
  const HostPair a{v4(2), v4(1)};
  const HostPair b{v4(3), v4(1)};
  const HostPair a_other_local{v4(2), v4(5)};
  const uint32_t ha = peers.handle_of(a);
  const uint32_t hb = peers.handle_of(b);
  const uint32_t hc = peers.handle_of(a_other_local);
  EXPECT_TRUE(is_remote_peer(ha) && is_remote_peer(hb) && is_remote_peer(hc));
  EXPECT_NE(ha, hb);
  EXPECT_NE(ha, hc);
  EXPECT_EQ(peers.handle_of(a), ha);
  EXPECT_EQ(peers.find(ha), a);
  EXPECT_EQ(peers.find(hc), a_other_local);
  EXPECT_FALSE(peers.find(4242).has_value());                   // a pid
  EXPECT_FALSE(peers.find(kRemotePeerBit | 1000).has_value());  // never handed out
  EXPECT_FALSE(is_remote_peer(4'194'304));                      // pid_max's ceiling
}

}  // namespace
}  // namespace softhca::cm
