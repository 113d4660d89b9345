// The datagram rsocket headers (src/rsocket/datagram_protocol): rdma-core's
// ds_header and ds_udp_header, and our fragment header, byte for byte.
#include "rsocket/datagram_protocol.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>

namespace softhca::rsocket {
namespace {

sockaddr_storage v4(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto& sin = reinterpret_cast<sockaddr_in&>(ss);
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sin.sin_addr);
  return ss;
}

TEST(RsocketDatagramProtocol, DsHeaderV4GoldenBytesAndBack) {
  uint8_t out[kDsHeaderMaxLen];
  ASSERT_EQ(encode_ds_header(v4("10.1.2.3", 7650), out), kDsHeaderV4Len);
  const uint8_t golden[kDsHeaderV4Len] = {4, 8, 0x1D, 0xE2, 10, 1, 2, 3};
  EXPECT_EQ(std::memcmp(out, golden, sizeof golden), 0);
  const auto back = decode_ds_header(out, kDsHeaderV4Len);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->length, kDsHeaderV4Len);
  const auto& sin = reinterpret_cast<const sockaddr_in&>(back->src);
  EXPECT_EQ(sin.sin_family, AF_INET);
  EXPECT_EQ(ntohs(sin.sin_port), 7650);
  EXPECT_EQ(ntohl(sin.sin_addr.s_addr), 0x0A010203u);
}

TEST(RsocketDatagramProtocol, DsHeaderV6CarriesFlowInfoAndAddress) {
  sockaddr_storage ss{};
  auto& sin6 = reinterpret_cast<sockaddr_in6&>(ss);
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(1);
  sin6.sin6_flowinfo = htonl(0x12345);
  sin6.sin6_addr = in6addr_loopback;
  uint8_t out[kDsHeaderMaxLen];
  ASSERT_EQ(encode_ds_header(ss, out), kDsHeaderV6Len);
  EXPECT_EQ(out[0], 6);
  EXPECT_EQ(out[1], kDsHeaderV6Len);
  EXPECT_EQ(out[3], 1);
  EXPECT_EQ(out[6], 0x23);
  EXPECT_EQ(out[23], 1);  // ::1
  const auto back = decode_ds_header(out, kDsHeaderV6Len);
  ASSERT_TRUE(back);
  EXPECT_EQ(std::memcmp(&back->src, &ss, sizeof(sockaddr_in6)), 0);
  EXPECT_FALSE(decode_ds_header(out, kDsHeaderV6Len - 1));  // cut short
}

TEST(RsocketDatagramProtocol, MalformedDsHeadersAreRefused) {
  const uint8_t bad_version[8] = {5, 8, 0, 0, 0, 0, 0, 0};
  const uint8_t bad_length[8] = {4, 24, 0, 0, 0, 0, 0, 0};
  EXPECT_FALSE(decode_ds_header(bad_version, 8));
  EXPECT_FALSE(decode_ds_header(bad_length, 8));
  EXPECT_FALSE(decode_ds_header(bad_version, 3));
}

TEST(RsocketDatagramProtocol, UdpHeaderGoldenBytes) {
  uint8_t out[kDsUdpHeaderMaxLen];
  ASSERT_EQ(encode_ds_udp_header(MsgOp::kData, 0xABCDEF12, v4("127.0.0.1", 9), out), kDsUdpHeaderV4Len);
  const uint8_t golden[kDsUdpHeaderV4Len] = {0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0,
                                             0x00, 0xCD, 0xEF, 0x12, 127, 0, 0, 1};
  EXPECT_EQ(std::memcmp(out, golden, sizeof golden), 0);
  const auto back = decode_ds_udp_header(out, kDsUdpHeaderV4Len, AF_INET);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->op, MsgOp::kData);
  EXPECT_EQ(back->qpn, 0xCDEF12u);
  EXPECT_EQ(back->length, kDsUdpHeaderV4Len);

  ASSERT_EQ(encode_ds_udp_header(MsgOp::kCtrl, 7, v4("127.0.0.1", 9), out), kDsUdpHeaderV4Len);
  EXPECT_EQ(out[5], 7);
  EXPECT_EQ(decode_ds_udp_header(out, kDsUdpHeaderV4Len, AF_INET)->op, MsgOp::kCtrl);
  // The version must match the family the message came from, the tag be ours.
  EXPECT_FALSE(decode_ds_udp_header(out, kDsUdpHeaderV4Len, AF_INET6));
  out[0] = 0x54;
  EXPECT_FALSE(decode_ds_udp_header(out, kDsUdpHeaderV4Len, AF_INET));
}

TEST(RsocketDatagramProtocol, FragmentHeaderIsNoDsHeader) {
  uint8_t out[kFragHeaderLen];
  encode_frag_header(FragHeader{2040, 0x1234, 2, 3}, 4, out);
  const uint8_t golden[kFragHeaderLen] = {0x84, 8, 0x07, 0xF8, 0x12, 0x34, 2, 3};
  EXPECT_EQ(std::memcmp(out, golden, sizeof golden), 0);
  const auto back = decode_frag_header(out, sizeof out);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->total, 2040);
  EXPECT_EQ(back->id, 0x1234);
  EXPECT_EQ(back->index, 2);
  EXPECT_EQ(back->count, 3);
  // rdma-core's receiver (and ours) takes it for no datagram header.
  EXPECT_FALSE(decode_ds_header(out, sizeof out));
  // An index beyond the count, or a count of one, is malformed.
  out[6] = 3;
  EXPECT_FALSE(decode_frag_header(out, sizeof out));
  out[6] = 0;
  out[7] = 1;
  EXPECT_FALSE(decode_frag_header(out, sizeof out));
}

}  // namespace
}  // namespace softhca::rsocket
