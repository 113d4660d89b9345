// RoCEv2 datagrams as senders other than softhca write them (issue #41),
// over the udp link (ctest: udp.foreign_sender, alone in a network
// namespace with SOFTHCA_LINK=udp): a UD SEND to a softhca UD QP, its
// headers and ICRC built here from IBTA's layout with zlib's CRC-32 (no
// code shared with src/wire), sent
//   - over IPv4 with the IP Identification a sender's kernel chose: rxe's
//     are the kernel's running counter (22161, 22162, ...), a NIC's its
//     own. A raw socket writes the whole IPv4 header, ID included, and the
//     ICRC covers it; UDP checksum 0, as rxe sends it;
//   - over IPv6 with UDP checksum 0 (UDP_NO_CHECK6_TX), as rxe and RoCE NICs
//     send RoCEv2, which a UDP socket drops unless told otherwise.
// Each must reach the QP with its payload; a datagram whose ICRC is wrong
// must not, and is counted in icrc_err_drops.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "loopback.hpp"
#include "stat_counter.hpp"

namespace {

using namespace loopback;

constexpr uint16_t kRoceV2Port = 4791;
constexpr uint8_t kUdSendOnly = 0x64;
constexpr uint32_t kQkey = 0x1234ABCD;
constexpr uint32_t kGrh = 40;
constexpr uint16_t kSourcePort = 0xC123;  // rdma-core's range for RoCEv2 source ports

void put16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void put32(std::vector<uint8_t>& b, uint32_t v) {
  put16(b, static_cast<uint16_t>(v >> 16));
  put16(b, static_cast<uint16_t>(v));
}

// BTH + DETH + payload of a UD SEND Only to `qpn`, without the ICRC.
std::vector<uint8_t> ud_send(uint32_t qpn, uint32_t src_qpn, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b;
  const uint8_t pad = static_cast<uint8_t>((4 - payload.size() % 4) % 4);
  b.push_back(kUdSendOnly);
  b.push_back(static_cast<uint8_t>(pad << 4));
  put16(b, 0xFFFF);  // P_Key
  b.push_back(0);
  b.push_back(static_cast<uint8_t>(qpn >> 16));
  put16(b, static_cast<uint16_t>(qpn));
  put32(b, 0x00000007);  // AckReq 0, PSN 7
  put32(b, kQkey);
  put32(b, src_qpn & 0xFFFFFF);
  b.insert(b.end(), payload.begin(), payload.end());
  b.insert(b.end(), pad, 0);
  return b;
}

// The ICRC of `transport` (BTH onwards) behind the masked `ip_udp` header
// image (its variant fields already all ones), appended least significant
// byte first.
void append_icrc(std::vector<uint8_t>& transport, const std::vector<uint8_t>& masked_ip_udp) {
  std::vector<uint8_t> image(8, 0xFF);
  image.insert(image.end(), masked_ip_udp.begin(), masked_ip_udp.end());
  std::vector<uint8_t> covered = transport;
  covered[4] = 0xFF;
  image.insert(image.end(), covered.begin(), covered.end());
  const uint32_t icrc = static_cast<uint32_t>(crc32(0, image.data(), static_cast<uInt>(image.size())));
  for (int i = 0; i < 4; ++i) transport.push_back(static_cast<uint8_t>(icrc >> (8 * i)));
}

// A whole IPv4 packet 127.0.0.1 -> 127.0.0.1:4791 with IP ID `id`, DF, TTL
// 64, UDP checksum 0, carrying `transport` with its ICRC over that header.
std::vector<uint8_t> ipv4_packet(uint16_t id, std::vector<uint8_t> transport, bool corrupt_icrc = false) {
  const uint16_t udp_length = static_cast<uint16_t>(8 + transport.size() + 4);
  std::vector<uint8_t> ip = {0x45, 0x00};
  put16(ip, static_cast<uint16_t>(20 + udp_length));
  put16(ip, id);
  ip.insert(ip.end(), {0x40, 0x00, 64, 17, 0x00, 0x00, 127, 0, 0, 1, 127, 0, 0, 1});
  uint32_t sum = 0;  // the header checksum (the kernel fills it too; written for the record)
  for (std::size_t i = 0; i < ip.size(); i += 2) sum += static_cast<uint32_t>(ip[i] << 8 | ip[i + 1]);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  ip[10] = static_cast<uint8_t>(~sum >> 8);
  ip[11] = static_cast<uint8_t>(~sum);
  std::vector<uint8_t> udp;
  put16(udp, kSourcePort);
  put16(udp, kRoceV2Port);
  put16(udp, udp_length);
  put16(udp, 0);
  std::vector<uint8_t> masked = ip;
  masked[1] = masked[8] = masked[10] = masked[11] = 0xFF;
  masked.insert(masked.end(), udp.begin(), udp.end());
  masked[20 + 6] = masked[20 + 7] = 0xFF;
  append_icrc(transport, masked);
  if (corrupt_icrc) transport.back() ^= 0x01;
  std::vector<uint8_t> packet = ip;
  packet.insert(packet.end(), udp.begin(), udp.end());
  packet.insert(packet.end(), transport.begin(), transport.end());
  return packet;
}

class ForeignSender : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg.type = IBV_QPT_UD;
    cfg.qkey = kQkey;
    pair.emplace(dev, cfg);
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(pair->ok());
    const uint8_t loopback4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1};
    if (std::memcmp(dev.gid.raw, loopback4, 16) != 0) GTEST_SKIP() << "GID 0 is not ::ffff:127.0.0.1 (run under ctest)";
  }
  // Posts a receive of a GRH and 64 bytes into slot `slot` of `into`.
  void post_slot(Buffer& into, int slot) {
    ibv_sge sge = into.sge(static_cast<uint32_t>(slot) * 128, kGrh + 64);
    ASSERT_EQ(post_recv(pair->b, static_cast<uint64_t>(slot), &sge, 1), 0);
  }
  // The payload that names datagram `tag`.
  static std::vector<uint8_t> payload_of(uint32_t tag) {
    std::vector<uint8_t> p(16);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(tag * 31 + i);
    return p;
  }
  // Waits for the receive of slot `slot` and checks it holds `tag`'s payload.
  void expect_received(Buffer& into, int slot, uint32_t tag, const char* what) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(pair->b_recv_cq, &wc)) << what << ": never arrived";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << what;
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(slot)) << what;
    EXPECT_EQ(wc.byte_len, kGrh + 16) << what;
    EXPECT_EQ(wc.src_qp, 0x123456u) << what;
    const auto want = payload_of(tag);
    EXPECT_EQ(std::memcmp(into.data() + slot * 128 + kGrh, want.data(), want.size()), 0) << what;
  }

  Device dev;
  QpConfig cfg;
  std::optional<QpPair> pair;
};

TEST_F(ForeignSender, Ipv4DatagramsReachTheQpWhateverTheirIpId) {
  const int raw = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  ASSERT_GE(raw, 0) << "raw socket: " << std::strerror(errno) << " (needs CAP_NET_RAW: run under ctest)";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The IDs, rxe's, and the extremes. (The kernel fills in an ID
  // of 0 on a raw socket, so 0 is not among them: softhca's own datagrams
  // carry it, and every other test sends those.)
  const std::vector<uint16_t> ids = {1, 2, 63, 64, 255, 256, 1000, 4660, 22161, 22162, 32768, 54321, 65535};
  Buffer into(dev.pd, 128 * (ids.size() + 2));
  for (std::size_t i = 0; i < ids.size(); ++i) post_slot(into, static_cast<int>(i));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto packet = ipv4_packet(ids[i], ud_send(pair->b->qp_num, 0x123456, payload_of(ids[i])));
    ASSERT_EQ(::sendto(raw, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(packet.size()));
    expect_received(into, static_cast<int>(i), ids[i], ("IPv4 ID " + std::to_string(ids[i])).c_str());
  }

  // A wrong ICRC is no ID's: dropped and counted. The good datagram sent
  // after it is the barrier: once it is received, the bad one was judged.
  const long long drops_before = stat_counter("--port", "icrc_err_drops");
  ASSERT_GE(drops_before, 0) << "softhca stat has no icrc_err_drops";
  const int bad_slot = static_cast<int>(ids.size());
  post_slot(into, bad_slot);
  const auto bad = ipv4_packet(22163, ud_send(pair->b->qp_num, 0x123456, payload_of(1)), /*corrupt_icrc=*/true);
  const auto good = ipv4_packet(22164, ud_send(pair->b->qp_num, 0x123456, payload_of(2)));
  ASSERT_EQ(::sendto(raw, bad.data(), bad.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(bad.size()));
  ASSERT_EQ(::sendto(raw, good.data(), good.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(good.size()));
  expect_received(into, bad_slot, 2, "the datagram after the corrupted one");
  EXPECT_EQ(stat_counter("--port", "icrc_err_drops"), drops_before + 1);
  ::close(raw);
}

TEST_F(ForeignSender, Ipv6DatagramsWithUdpChecksumZeroReachTheQp) {
  // The port's GID for ::1.
  const uint8_t loopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  bool has_loopback6 = false;
  for (int index = 0; index < 16 && !has_loopback6; ++index) {
    ibv_gid gid{};
    if (ibv_query_gid(dev.ctx, 1, index, &gid) == 0 && std::memcmp(gid.raw, loopback6, 16) == 0) has_loopback6 = true;
  }
  ASSERT_TRUE(has_loopback6) << "no GID for ::1";
  const int fd = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  const int one = 1;
  ASSERT_EQ(::setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_TX, &one, sizeof one), 0);
  sockaddr_in6 from{};
  from.sin6_family = AF_INET6;
  from.sin6_addr = in6addr_loopback;
  from.sin6_port = htons(kSourcePort);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << std::strerror(errno);
  sockaddr_in6 to = from;
  to.sin6_port = htons(kRoceV2Port);

  Buffer into(dev.pd, 128 * 4);
  for (int slot = 0; slot < 3; ++slot) {
    post_slot(into, slot);
    auto transport = ud_send(pair->b->qp_num, 0x123456, payload_of(100 + static_cast<uint32_t>(slot)));
    // The masked IPv6 header: traffic class, flow label and hop limit all ones.
    const uint16_t udp_length = static_cast<uint16_t>(8 + transport.size() + 4);
    std::vector<uint8_t> masked = {0x6F, 0xFF, 0xFF, 0xFF};
    put16(masked, udp_length);
    masked.insert(masked.end(), {17, 0xFF});
    masked.insert(masked.end(), loopback6, loopback6 + 16);
    masked.insert(masked.end(), loopback6, loopback6 + 16);
    put16(masked, kSourcePort);
    put16(masked, kRoceV2Port);
    put16(masked, udp_length);
    put16(masked, 0xFFFF);
    append_icrc(transport, masked);
    ASSERT_EQ(::sendto(fd, transport.data(), transport.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(transport.size()));
    expect_received(into, slot, 100 + static_cast<uint32_t>(slot), "IPv6, UDP checksum 0");
  }
  ::close(fd);
}

}  // namespace
