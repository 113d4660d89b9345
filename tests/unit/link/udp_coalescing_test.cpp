// The udp link's sockets on 127.0.0.1: a run of equal-size packets sent in
// one call leaves as one GSO message and arrives as one coalesced datagram
// (UDP_GRO) whose segments are exactly the packets sent, in order, but for
// the last four bytes (the ICRC) of segment i, recomputed for the IPv4 ID i
// the kernel gives it; packets of other sizes keep their boundaries. Runs in a network namespace of its
// own (see CMakeLists.txt), holding port 4791 alone.
#include <gtest/gtest.h>
#include <poll.h>

#include <vector>

#include "link/udp/udp_sockets.hpp"
#include "wire/icrc.hpp"

namespace softhca::udp {
namespace {

wire::Gid loopback() {
  wire::Gid g{};
  g[10] = g[11] = 0xFF;
  g[12] = 127;
  g[15] = 1;
  return g;
}

// Packet `i` of `size` bytes, each byte telling which packet it belongs to.
std::vector<uint8_t> packet_bytes(size_t i, size_t size) {
  std::vector<uint8_t> b(size);
  for (size_t j = 0; j < size; ++j) b[j] = static_cast<uint8_t>(i * 31 + j);
  return b;
}

// `packet` as it leaves as segment `index` of a GSO send: its ICRC (here
// arbitrary bytes, as the sockets do not check it) moved to that of IPv4 ID
// `index`.
std::vector<uint8_t> as_segment(std::vector<uint8_t> packet, size_t index) {
  const auto icrc = std::span<uint8_t>(packet).last<wire::kIcrcSize>();
  wire::store_icrc(wire::load_icrc(icrc) ^ wire::icrc_ipv4_id_delta(static_cast<uint16_t>(index), packet.size()), icrc);
  return packet;
}

class UdpCoalescing : public ::testing::Test {
 protected:
  void SetUp() override { open({}); }
  void open(const SocketOptions& options) {
    sockets_.reset();
    auto s = Sockets::open(options);
    ASSERT_TRUE(s.has_value());
    sockets_ = std::move(*s);
  }

  // What arrives within 5 s until `count` packets came: each datagram, and
  // the packets it holds (a coalesced one split at its segment size).
  void receive(size_t count) {
    std::vector<uint8_t> storage(16 * kSlot);
    std::vector<Received> received(16);
    while (arrived_.size() < count) {
      pollfd p{sockets_->v4_fd(), POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 5000), 1) << "only " << arrived_.size() << " of " << count << " packets came";
      const int n = sockets_->receive_batch(sockets_->v4_fd(), storage, kSlot, received);
      for (int i = 0; i < n; ++i) {
        const Received& r = received[static_cast<size_t>(i)];
        datagrams_.push_back(r);
        const uint8_t* at = storage.data() + static_cast<size_t>(i) * kSlot;
        const size_t step = r.segment_size ? r.segment_size : r.length;
        for (size_t off = 0; off < r.length; off += step)
          arrived_.emplace_back(at + off, at + off + std::min(step, r.length - off));
      }
    }
  }

  static constexpr size_t kSlot = 65536;
  std::unique_ptr<Sockets> sockets_;
  std::vector<Received> datagrams_;
  std::vector<std::vector<uint8_t>> arrived_;
};

TEST_F(UdpCoalescing, ARunOfEqualPacketsArrivesAsOneDatagramOfThosePackets) {
  // As a WRITE at MTU 1024 leaves: FIRST (with its RETH), MIDDLEs 16 bytes
  // shorter, and a shorter LAST. The first MIDDLE, shorter, ends the
  // FIRST's run; the other MIDDLEs and the LAST make the next.
  std::vector<std::vector<uint8_t>> sent;
  sent.push_back(packet_bytes(0, 1056));
  for (size_t i = 1; i <= 10; ++i) sent.push_back(packet_bytes(i, 1040));
  sent.push_back(packet_bytes(11, 532));
  std::vector<OutgoingPacket> out;
  for (const auto& b : sent) out.push_back(OutgoingPacket{loopback(), loopback(), 0, 64, b, 0});
  const auto before = sent;
  ASSERT_EQ(sockets_->send_batch(out), 0U);
  EXPECT_EQ(sent, before) << "the packets' own buffers keep their ID-0 ICRCs";

  receive(sent.size());
  std::vector<std::vector<uint8_t>> expected;
  expected.push_back(sent[0]);
  expected.push_back(as_segment(sent[1], 1));
  for (size_t i = 2; i < sent.size(); ++i) expected.push_back(as_segment(sent[i], i - 2));
  EXPECT_NE(expected[3], sent[3]);
  EXPECT_EQ(arrived_, expected);
  ASSERT_EQ(datagrams_.size(), 2U) << "the runs did not arrive whole";
  EXPECT_EQ(datagrams_[0].segment_size, 1056U);
  EXPECT_EQ(datagrams_[0].length, 1056U + 1040U);
  EXPECT_EQ(datagrams_[1].segment_size, 1040U);
  EXPECT_EQ(datagrams_[1].length, 9 * 1040U + 532U);
  EXPECT_EQ(datagrams_[1].src, loopback());
  EXPECT_EQ(datagrams_[1].dst, loopback());
  EXPECT_EQ(datagrams_[1].src_port, sockets_->source_port(true));
}

TEST_F(UdpCoalescing, PacketsOfDifferentSizesKeepTheirBoundaries) {
  std::vector<std::vector<uint8_t>> sent;
  for (size_t i = 0; i < 6; ++i) sent.push_back(packet_bytes(i, 100 + 40 * i));
  std::vector<OutgoingPacket> out;
  for (const auto& b : sent) out.push_back(OutgoingPacket{loopback(), loopback(), 0, 64, b, 0});
  ASSERT_EQ(sockets_->send_batch(out), 0U);

  receive(sent.size());
  EXPECT_EQ(arrived_, sent);
  EXPECT_EQ(datagrams_.size(), sent.size());
}

// SOFTHCA_UDP_GSO=off, for peers that accept IPv4 ID 0 only (a softhca
// from before issue #9's fix): every packet leaves alone, as it was built.
TEST_F(UdpCoalescing, WithoutGsoEveryPacketLeavesAlone) {
  open({.gso = false});
  std::vector<std::vector<uint8_t>> sent;
  for (size_t i = 0; i < 8; ++i) sent.push_back(packet_bytes(i, 1040));
  std::vector<OutgoingPacket> out;
  for (const auto& b : sent) out.push_back(OutgoingPacket{loopback(), loopback(), 0, 64, b, 0});
  ASSERT_EQ(sockets_->send_batch(out), 0U);

  receive(sent.size());
  EXPECT_EQ(arrived_, sent);
  EXPECT_EQ(datagrams_.size(), sent.size());
  for (const Received& r : datagrams_) EXPECT_EQ(r.segment_size, 0U);
}

}  // namespace
}  // namespace softhca::udp
