// The CM message codec against golden bytes written out from the IBTA tables
// (vol. 1, 12.6: REQ table 106, REJ 108, REP 110, RTU 111, DREQ 112, DREP 113)
// and rdma_cm's IP private-data header, plus round trips and bad input.
#include "cm/mad_codec.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace softhca::cm {
namespace {

// Expected bytes: a zeroed MAD with the common header of a CM Send.
MadBytes mad_header(uint64_t tid, uint16_t attr) {
  MadBytes b{};
  b[0] = 0x01;  // base version
  b[1] = 0x07;  // management class: CM
  b[2] = 0x02;  // class version
  b[3] = 0x03;  // method: Send
  for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(tid >> (56 - 8 * i));
  b[16] = static_cast<uint8_t>(attr >> 8);
  b[17] = static_cast<uint8_t>(attr);
  return b;
}

// Payload offset -> MAD offset.
constexpr std::size_t P(std::size_t off) { return 24 + off; }

void put(MadBytes& b, std::size_t payload_off, std::initializer_list<uint8_t> bytes) {
  std::size_t i = P(payload_off);
  for (uint8_t v : bytes) b[i++] = v;
}

Gid gid(uint8_t last) {
  Gid g{};
  g[10] = g[11] = 0xff;
  g[12] = 127;
  g[15] = last;
  return g;
}

TEST(CmMadCodec, ReqGoldenBytes) {
  ReqMsg req;
  req.local_comm_id = 0x11223344;
  req.vendor_id = 0x0A0B0C;
  req.service_id = service_id(0x0106, 7174);  // RDMA_PS_TCP, port 7174
  req.local_ca_guid = 0x0102030405060708ULL;
  req.local_qkey = 0xCAFEBABE;
  req.local_qpn = 0x123456;
  req.responder_resources = 1;
  req.initiator_depth = 2;
  req.remote_cm_response_timeout = 20;
  req.transport = TransportType::kRc;
  req.end_to_end_flow_control = true;
  req.starting_psn = 0xABCDEF;
  req.local_cm_response_timeout = 20;
  req.retry_count = 7;
  req.pkey = 0xFFFF;
  req.path_mtu = 5;
  req.rnr_retry_count = 6;
  req.max_cm_retries = 15;
  req.srq = true;
  req.primary_local_gid = gid(1);
  req.primary_remote_gid = gid(2);
  req.primary_flow_label = 0x12345;
  req.primary_packet_rate = 3;
  req.primary_traffic_class = 0x20;
  req.primary_hop_limit = 64;
  req.primary_sl = 5;
  req.primary_subnet_local = true;
  req.primary_local_ack_timeout = 14;
  for (std::size_t i = 0; i < req.private_data.size(); ++i) req.private_data[i] = static_cast<uint8_t>(i + 1);

  MadBytes want = mad_header(0x1122334455667788ULL, 0x0010);
  put(want, 0, {0x11, 0x22, 0x33, 0x44});
  put(want, 5, {0x0A, 0x0B, 0x0C});
  put(want, 8, {0, 0, 0, 0, 0x01, 0x06, 0x1C, 0x06});  // (0x0106 << 16) + 7174
  put(want, 16, {1, 2, 3, 4, 5, 6, 7, 8});
  put(want, 28, {0xCA, 0xFE, 0xBA, 0xBE});
  put(want, 32, {0x12, 0x34, 0x56, 0x01});  // QPN, responder resources
  put(want, 36, {0, 0, 0, 0x02});           // EECN, initiator depth
  put(want, 40, {0, 0, 0, (20 << 3) | (0 << 1) | 1});
  put(want, 44, {0xAB, 0xCD, 0xEF, (20 << 3) | 7});
  put(want, 48, {0xFF, 0xFF, (5 << 4) | 6, (15 << 4) | (1 << 3)});
  const Gid g1 = gid(1), g2 = gid(2);
  std::memcpy(want.data() + P(56), g1.data(), 16);
  std::memcpy(want.data() + P(72), g2.data(), 16);
  put(want, 88, {0x12, 0x34, 0x50, 0x03});  // flow label (20 bits), packet rate (6 bits)
  put(want, 92, {0x20, 64, (5 << 4) | (1 << 3), 14 << 3});
  for (std::size_t i = 0; i < 92; ++i) want[P(140) + i] = static_cast<uint8_t>(i + 1);

  const MadBytes got = encode(Mad{0x1122334455667788ULL, CmMessage(req)});
  EXPECT_EQ(got, want);

  auto back = decode(got);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->tid, 0x1122334455667788ULL);
  ASSERT_TRUE(std::holds_alternative<ReqMsg>(back->msg));
  EXPECT_EQ(std::get<ReqMsg>(back->msg), req);
}

TEST(CmMadCodec, RepGoldenBytes) {
  RepMsg rep;
  rep.local_comm_id = 0xA1A2A3A4;
  rep.remote_comm_id = 0x11223344;
  rep.local_qkey = 0;
  rep.local_qpn = 0x654321;
  rep.vendor_id = 0xD1D2D3;
  rep.starting_psn = 0x0F0E0D;
  rep.responder_resources = 3;
  rep.initiator_depth = 4;
  rep.target_ack_delay = 15;
  rep.failover_accepted = 0;
  rep.end_to_end_flow_control = true;
  rep.rnr_retry_count = 7;
  rep.srq = true;
  rep.local_ca_guid = 0x1112131415161718ULL;
  rep.private_data[0] = 0xEE;
  rep.private_data[195] = 0xFF;

  MadBytes want = mad_header(7, 0x0013);
  put(want, 0, {0xA1, 0xA2, 0xA3, 0xA4, 0x11, 0x22, 0x33, 0x44});
  put(want, 12, {0x65, 0x43, 0x21, 0xD1});  // QPN, vendor ID high byte
  put(want, 16, {0, 0, 0, 0xD2});           // EECN, vendor ID middle byte
  put(want, 20, {0x0F, 0x0E, 0x0D, 0xD3});  // PSN, vendor ID low byte
  put(want, 24, {3, 4, (15 << 3) | 1, (7 << 5) | (1 << 4)});
  put(want, 28, {0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18});
  want[P(36)] = 0xEE;
  want[P(36 + 195)] = 0xFF;

  const MadBytes got = encode(Mad{7, CmMessage(rep)});
  EXPECT_EQ(got, want);
  auto back = decode(got);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::get<RepMsg>(back->msg), rep);
}

TEST(CmMadCodec, RejGoldenBytes) {
  RejMsg rej;
  rej.local_comm_id = 0;
  rej.remote_comm_id = 0x11223344;
  rej.message_rejected = RejectedMessage::kReq;
  rej.reason = static_cast<uint16_t>(RejReason::kInvalidServiceId);
  rej.private_data[0] = 'n';
  rej.private_data[1] = 'o';

  MadBytes want = mad_header(9, 0x0012);
  put(want, 4, {0x11, 0x22, 0x33, 0x44, 0 << 6, 0, 0x00, 0x08});
  want[P(84)] = 'n';
  want[P(85)] = 'o';
  EXPECT_EQ(encode(Mad{9, CmMessage(rej)}), want);

  rej.message_rejected = RejectedMessage::kRep;
  rej.ari_length = 8;
  rej.reason = static_cast<uint16_t>(RejReason::kConsumerDefined);
  const MadBytes got = encode(Mad{9, CmMessage(rej)});
  EXPECT_EQ(got[P(8)], 1 << 6);
  EXPECT_EQ(got[P(9)], 8 << 1);
  EXPECT_EQ(got[P(11)], 28);
  EXPECT_EQ(std::get<RejMsg>(decode(got)->msg), rej);
}

TEST(CmMadCodec, RtuDreqDrepGoldenBytes) {
  RtuMsg rtu{0x01020304, 0x05060708, {}};
  MadBytes want = mad_header(1, 0x0014);
  put(want, 0, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(encode(Mad{1, CmMessage(rtu)}), want);

  DreqMsg dreq{0x01020304, 0x05060708, 0xABCDEF, {}};
  want = mad_header(2, 0x0015);
  put(want, 0, {1, 2, 3, 4, 5, 6, 7, 8, 0xAB, 0xCD, 0xEF});
  EXPECT_EQ(encode(Mad{2, CmMessage(dreq)}), want);

  DrepMsg drep{0x01020304, 0x05060708, {}};
  want = mad_header(3, 0x0016);
  put(want, 0, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(encode(Mad{3, CmMessage(drep)}), want);

  for (const CmMessage& m : {CmMessage(rtu), CmMessage(dreq), CmMessage(drep)}) {
    auto back = decode(encode(Mad{5, m}));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->msg.index(), m.index());
    EXPECT_EQ(encode(*back), encode(Mad{5, m}));
  }
}

TEST(CmMadCodec, MraGoldenBytes) {
  // Table 107: comm IDs, then "message MRAed" in the top 2 bits of byte 8 and
  // the service timeout in the top 5 bits of byte 9; private data from 10.
  MraMsg mra;
  mra.local_comm_id = 0x01020304;
  mra.remote_comm_id = 0x05060708;
  mra.message_mraed = MraedMessage::kRep;
  mra.service_timeout = 24;  // rdma_cm's setting
  mra.private_data[0] = 0x5A;
  mra.private_data[221] = 0xA5;
  MadBytes want = mad_header(6, 0x0011);
  put(want, 0, {1, 2, 3, 4, 5, 6, 7, 8, 0x40, 0xC0, 0x5A});
  want[P(10 + 221)] = 0xA5;
  EXPECT_EQ(encode(Mad{6, CmMessage(mra)}), want);
  auto back = decode(want);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->tid, 6U);
  EXPECT_EQ(std::get<MraMsg>(back->msg), mra);
  EXPECT_STREQ(message_name(back->msg), "MRA");
}

TEST(CmMadCodec, SidrGoldenBytes) {
  SidrReqMsg req;
  req.request_id = 0x0A0B0C0D;
  req.pkey = 0xFFFF;
  req.service_id = service_id(0x0111, 7174);  // RDMA_PS_UDP
  req.private_data[0] = 0x00;
  req.private_data[1] = 0x40;
  req.private_data[215] = 0x99;
  MadBytes want = mad_header(4, 0x0017);
  put(want, 0, {0x0A, 0x0B, 0x0C, 0x0D, 0xFF, 0xFF, 0, 0});
  put(want, 8, {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06});
  want[P(17)] = 0x40;
  want[P(16 + 215)] = 0x99;
  EXPECT_EQ(encode(Mad{4, CmMessage(req)}), want);
  EXPECT_EQ(std::get<SidrReqMsg>(decode(want)->msg), req);

  SidrRepMsg rep;
  rep.request_id = 0x0A0B0C0D;
  rep.status = static_cast<uint8_t>(SidrStatus::kReject);
  rep.vendor_id = 0x123456;
  rep.qpn = 0xABCDEF;
  rep.service_id = service_id(0x0111, 7174);
  rep.qkey = 0x01234567;
  rep.private_data[0] = 0x77;
  want = mad_header(5, 0x0018);
  put(want, 0, {0x0A, 0x0B, 0x0C, 0x0D, 2, 0, 0x12, 0x34, 0xAB, 0xCD, 0xEF, 0x56});
  put(want, 12, {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06, 0x01, 0x23, 0x45, 0x67});
  want[P(96)] = 0x77;
  EXPECT_EQ(encode(Mad{5, CmMessage(rep)}), want);
  EXPECT_EQ(std::get<SidrRepMsg>(decode(want)->msg), rep);
}

TEST(CmMadCodec, DecodeRejectsWhatIsNotACmMad) {
  MadBytes ok = encode(Mad{1, CmMessage(RtuMsg{})});
  EXPECT_TRUE(decode(ok).has_value());

  std::vector<uint8_t> short_msg(ok.begin(), ok.begin() + 255);
  EXPECT_EQ(decode(short_msg).error(), std::errc::invalid_argument);
  std::vector<uint8_t> long_msg(ok.begin(), ok.end());
  long_msg.push_back(0);
  EXPECT_EQ(decode(long_msg).error(), std::errc::invalid_argument);

  for (int byte : {0, 1, 2, 3}) {
    MadBytes bad = ok;
    bad[byte] ^= 0x40;
    EXPECT_EQ(decode(bad).error(), std::errc::invalid_argument) << "header byte " << byte;
  }
  MadBytes lap = ok;
  lap[17] = 0x19;  // LAP: understood as CM, not implemented
  EXPECT_EQ(decode(lap).error(), std::errc::not_supported);
  MadBytes unknown = ok;
  unknown[17] = 0x7F;
  EXPECT_EQ(decode(unknown).error(), std::errc::invalid_argument);
}

TEST(CmMadCodec, RejAriLengthIsClamped) {
  MadBytes b = encode(Mad{1, CmMessage(RejMsg{})});
  b[P(9)] = 0xFE;  // 127: more than the 72-byte ARI field
  auto back = decode(b);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::get<RejMsg>(back->msg).ari_length, kRejAriSize);
}

TEST(CmMadCodec, IpHeaderGoldenBytesV4) {
  IpHeader hdr;
  hdr.ip_version = 4;
  hdr.src_port = 0x8001;
  hdr.src = gid(1);
  hdr.dst = gid(2);
  std::array<uint8_t, kIpHeaderSize> out{};
  encode_ip_header(hdr, out);
  std::array<uint8_t, kIpHeaderSize> want{};
  want[0] = 0x00;
  want[1] = 0x40;
  want[2] = 0x80;
  want[3] = 0x01;
  want[4 + 12] = 127;
  want[4 + 15] = 1;
  want[20 + 12] = 127;
  want[20 + 15] = 2;
  EXPECT_EQ(out, want);
  auto back = decode_ip_header(out);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, hdr);
}

TEST(CmMadCodec, IpHeaderV6AndBadVersions) {
  IpHeader hdr;
  hdr.ip_version = 6;
  hdr.src_port = 7;
  hdr.src[15] = 1;  // ::1
  hdr.dst[0] = 0xfd;
  hdr.dst[15] = 2;
  std::array<uint8_t, kIpHeaderSize> out{};
  encode_ip_header(hdr, out);
  EXPECT_EQ(out[1], 0x60);
  EXPECT_EQ(out[4 + 15], 1);
  EXPECT_EQ(out[20], 0xfd);
  EXPECT_EQ(*decode_ip_header(out), hdr);

  out[1] = 0x50;
  EXPECT_FALSE(decode_ip_header(out).has_value());
  out[1] = 0x40;
  out[0] = 1;  // cma version
  EXPECT_FALSE(decode_ip_header(out).has_value());
}

TEST(CmMadCodec, ServiceIds) {
  EXPECT_EQ(service_id(0x0106, 0x1C06), 0x00000000'01061C06ULL);
  EXPECT_EQ(service_id_ps(0x01061C06), 0x0106);
  EXPECT_EQ(service_id_port(0x01061C06), 0x1C06);
  EXPECT_TRUE(is_ip_service_id(0x01061C06));
  EXPECT_FALSE(is_ip_service_id(0x1000000001061C06ULL));
}

}  // namespace
}  // namespace softhca::cm
