// Which packets of a batch the udp link sends as one GSO message: runs to one
// destination whose packets all have the first one's size, but for a last
// one that may be shorter, within the kernel's limits (udp_sockets.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "link/udp/udp_sockets.hpp"

namespace softhca::udp {
namespace {

wire::Gid ipv4(uint8_t last) {
  wire::Gid g{};
  g[10] = g[11] = 0xFF;
  g[12] = 198;
  g[13] = 18;
  g[15] = last;
  return g;
}

class GsoRun : public ::testing::Test {
 protected:
  // A packet of `size` bytes from .1 to `to`.
  void add(size_t size, uint8_t to = 2) {
    storage_.emplace_back(size, uint8_t{0});
    OutgoingPacket p;
    p.src = ipv4(1);
    p.dst = ipv4(to);
    packets_.push_back(p);
  }
  std::span<const OutgoingPacket> packets() {
    for (size_t i = 0; i < packets_.size(); ++i) packets_[i].bytes = storage_[i];
    return packets_;
  }
  std::vector<std::vector<uint8_t>> storage_;
  std::vector<OutgoingPacket> packets_;
};

TEST_F(GsoRun, EqualPacketsGoTogether) {
  for (int i = 0; i < 10; ++i) add(1040);
  EXPECT_EQ(gso_run(packets(), 64), 10U);
}

TEST_F(GsoRun, AShorterPacketEndsTheRun) {
  for (int i = 0; i < 4; ++i) add(1040);
  add(532);
  add(532);
  EXPECT_EQ(gso_run(packets(), 64), 5U);
  EXPECT_EQ(gso_run(packets().subspan(5), 64), 1U);
}

TEST_F(GsoRun, ALongerPacketStartsAnother) {
  add(1040);
  add(1040);
  add(1056);  // a WRITE FIRST, with its RETH
  add(1040);  // its first MIDDLE: shorter, so it may end the FIRST's run
  add(1040);
  EXPECT_EQ(gso_run(packets(), 64), 2U);
  EXPECT_EQ(gso_run(packets().subspan(2), 64), 2U);
  EXPECT_EQ(gso_run(packets().subspan(4), 64), 1U);
}

TEST_F(GsoRun, AnotherDestinationStartsAnother) {
  add(20);
  add(20);
  add(20, 3);
  EXPECT_EQ(gso_run(packets(), 64), 2U);
}

TEST_F(GsoRun, StopsAtTheKernelsLimitsAndTheCallersRoom) {
  for (int i = 0; i < 100; ++i) add(100);
  EXPECT_EQ(gso_run(packets(), 100), kGsoMaxSegments);
  EXPECT_EQ(gso_run(packets(), 7), 7U);
  storage_.clear();
  packets_.clear();
  for (int i = 0; i < 64; ++i) add(4112);  // MTU 4096: fifteen fit in one IP datagram
  EXPECT_EQ(gso_run(packets(), 64), kGsoMaxBytes / 4112);
}

TEST_F(GsoRun, MulticastGoesAlone) {
  add(100);
  add(100);
  packets_[0].ifindex = packets_[1].ifindex = 2;
  EXPECT_EQ(gso_run(packets(), 64), 1U);
}

}  // namespace
}  // namespace softhca::udp
