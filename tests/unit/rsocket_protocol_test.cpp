// The rsocket wire format (src/rsocket/protocol): rdma-core's immediate
// encoding and the 40 bytes of rs_conn_data, checked byte for byte.
#include "rsocket/protocol.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace softhca::rsocket {
namespace {

TEST(RsocketProtocol, ImmediateCarriesOpInTopThreeBits) {
  EXPECT_EQ(msg_encode(MsgOp::kData, 4096), 0x00001000u);
  EXPECT_EQ(msg_encode(MsgOp::kSgl, 384), 0x80000180u);
  EXPECT_EQ(msg_encode(MsgOp::kIomapSgl, 3), 0xC0000003u);
  EXPECT_EQ(msg_encode(MsgOp::kCtrl, static_cast<uint32_t>(CtrlCode::kShutdown)), 0xE0000002u);
  const uint32_t msg = msg_encode(MsgOp::kData, kMsgDataMask);
  EXPECT_EQ(msg_op(msg), MsgOp::kData);
  EXPECT_EQ(msg_data(msg), kMsgDataMask);
  // Data wider than 29 bits cannot leak into the operation.
  EXPECT_EQ(msg_op(msg_encode(MsgOp::kData, 0xFFFFFFFF)), MsgOp::kData);
}

TEST(RsocketProtocol, ConnDataGoldenBytes) {
  ConnData data;
  data.flags = kConnFlagIomap;
  data.credits = 384;
  data.target_iomap_size = 0;
  data.target_sgl = RemoteSge{0x0102030405060708ull, 0x11223344, 2};
  data.data_buf = RemoteSge{0xA0A1A2A3A4A5A6A7ull, 0x55667788, 65536};
  uint8_t out[kConnDataSize];
  encode_conn_data(data, out);
  const uint8_t golden[kConnDataSize] = {
      1,    2,    0x01, 0x80, 0,    0,    0,    0,                         // version, flags, credits, rsvd, iomap
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x22, 0x33, 0x44,  // target_sgl addr, key
      0,    0,    0,    2,                                                 // target_sgl length
      0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0x55, 0x66, 0x77, 0x88,  // data_buf addr, key
      0,    1,    0,    0};                                                // data_buf length
  EXPECT_EQ(std::memcmp(out, golden, sizeof golden), 0);

  auto back = decode_conn_data(out, sizeof out);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->credits, 384);
  EXPECT_EQ(back->flags, kConnFlagIomap);
  EXPECT_EQ(back->target_sgl.addr, data.target_sgl.addr);
  EXPECT_EQ(back->target_sgl.key, data.target_sgl.key);
  EXPECT_EQ(back->target_sgl.length, 2u);
  EXPECT_EQ(back->data_buf.addr, data.data_buf.addr);
  EXPECT_EQ(back->data_buf.length, 65536u);
}

TEST(RsocketProtocol, ConnDataRejectsShortOrForeignVersion) {
  uint8_t out[kConnDataSize];
  encode_conn_data(ConnData{}, out);
  EXPECT_FALSE(decode_conn_data(out, kConnDataSize - 1).has_value());
  EXPECT_FALSE(decode_conn_data(nullptr, kConnDataSize).has_value());
  out[0] = 2;
  EXPECT_FALSE(decode_conn_data(out, sizeof out).has_value());
}

TEST(RsocketProtocol, IomapSizeScaleMatchesRdmaCore) {
  // Up to 128 as is; above, the top bit plus value >> 8.
  EXPECT_EQ(value_to_scale(0, 8), 0u);
  EXPECT_EQ(value_to_scale(128, 8), 128u);
  EXPECT_EQ(value_to_scale(512, 8), 0x82u);
  EXPECT_EQ(scale_to_value(0x82, 8), 512u);
  EXPECT_EQ(scale_to_value(value_to_scale(100, 8), 8), 100u);
}

}  // namespace
}  // namespace softhca::rsocket
