// The checks every packet from the network meets before a QP listens to it
// (transport/admission.hpp): IBTA's P_Key match and a connected QP's peer
// addresses.
#include "transport/admission.hpp"

#include <gtest/gtest.h>

namespace softhca::transport {
namespace {

TEST(PkeyMatch, TheDefaultEntryTakesItsOwnPartitionOnly) {
  EXPECT_TRUE(pkey_matches(0xFFFF, kDefaultPkey));
  // A limited member of the default partition talks to the full entry.
  EXPECT_TRUE(pkey_matches(0x7FFF, kDefaultPkey));
  EXPECT_FALSE(pkey_matches(0x1234, kDefaultPkey));
  EXPECT_FALSE(pkey_matches(0x9234, kDefaultPkey));
  EXPECT_FALSE(pkey_matches(0xFFFE, kDefaultPkey));
  EXPECT_FALSE(pkey_matches(0x0000, kDefaultPkey));
  EXPECT_FALSE(pkey_matches(0x8000, kDefaultPkey));
}

TEST(PkeyMatch, TwoLimitedMembersNeverMatchAndPartitionZeroIsInvalid) {
  EXPECT_TRUE(pkey_matches(0x8123, 0x0123));
  EXPECT_TRUE(pkey_matches(0x0123, 0x8123));
  EXPECT_TRUE(pkey_matches(0x8123, 0x8123));
  EXPECT_FALSE(pkey_matches(0x0123, 0x0123));
  EXPECT_FALSE(pkey_matches(0x8000, 0x8000));
  EXPECT_FALSE(pkey_matches(0x0000, 0x8000));
}

wire::Gid v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d};
}

TEST(FromPeer, BothAddressesMustBeTheConnections) {
  const wire::Gid own = v4(198, 18, 1, 1), peer = v4(198, 18, 1, 2), stranger = v4(198, 18, 1, 3);
  uint8_t own_raw[16], peer_raw[16];
  std::copy(own.begin(), own.end(), own_raw);
  std::copy(peer.begin(), peer.end(), peer_raw);
  EXPECT_TRUE(from_peer(peer, own, own_raw, peer_raw));
  EXPECT_FALSE(from_peer(stranger, own, own_raw, peer_raw));
  // To another address of ours (a host with several): not this connection.
  EXPECT_FALSE(from_peer(peer, stranger, own_raw, peer_raw));
  // The right addresses the wrong way round (our own, reflected back).
  EXPECT_FALSE(from_peer(own, peer, own_raw, peer_raw));
  // The peer's IPv4 address written as a plain IPv6 one is another address.
  wire::Gid unmapped = peer;
  unmapped[10] = unmapped[11] = 0;
  EXPECT_FALSE(from_peer(unmapped, own, own_raw, peer_raw));
}

TEST(FromPeer, Ipv6LinkLocalPeersAreTheirAddresses) {
  const wire::Gid own = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  wire::Gid peer = own;
  peer[15] = 0x56;
  uint8_t own_raw[16], peer_raw[16];
  std::copy(own.begin(), own.end(), own_raw);
  std::copy(peer.begin(), peer.end(), peer_raw);
  EXPECT_TRUE(from_peer(peer, own, own_raw, peer_raw));
  wire::Gid other = peer;
  other[15] = 0x57;
  EXPECT_FALSE(from_peer(other, own, own_raw, peer_raw));
}

}  // namespace
}  // namespace softhca::transport
