// The queue sizing rules (engine/queue_sizes.hpp), at their edges.
#include "engine/queue_sizes.hpp"

#include <bit>

#include <gtest/gtest.h>

#include "common/limits.hpp"

namespace softhca::engine {
namespace {

TEST(QueueSizes, CqSlotsAreThePowerOfTwoAboveCqe) {
  EXPECT_EQ(cq_size_for(1).slots, 2u);
  EXPECT_EQ(cq_size_for(1).reported, 1u);
  EXPECT_EQ(cq_size_for(2).slots, 4u);
  EXPECT_EQ(cq_size_for(2).reported, 3u);
  EXPECT_EQ(cq_size_for(3).slots, 4u);
  EXPECT_EQ(cq_size_for(4).slots, 8u);
  EXPECT_EQ(cq_size_for(limits::kMaxCqe).slots, uint32_t{limits::kMaxCqe} + 1);
  EXPECT_EQ(cq_size_for(limits::kMaxCqe).reported, uint32_t{limits::kMaxCqe});
}

TEST(QueueSizes, ReceiveQueuesRoundUp) {
  EXPECT_EQ(recv_queue_size_for(0), 0u);
  EXPECT_EQ(recv_queue_size_for(1), 1u);
  EXPECT_EQ(recv_queue_size_for(5), 8u);
  EXPECT_EQ(recv_queue_size_for(8), 8u);
  EXPECT_EQ(srq_size_for(1), 1u);
  EXPECT_EQ(srq_size_for(2), 3u);
  EXPECT_EQ(srq_size_for(3), 3u);
  EXPECT_EQ(srq_size_for(4), 7u);
  EXPECT_EQ(srq_size_for(limits::kMaxSrqWr), uint32_t{limits::kMaxSrqWr});
}

// A full receive queue still leaves slots free in its ring, so that the
// slot posted into is never the one a sender has just read.
TEST(QueueSizes, ReceiveRingsHaveSlotsToSpare) {
  for (const uint32_t asked : {1u, 5u, 8u, 500u, 512u, 4096u, uint32_t{limits::kMaxQpWr}}) {
    const uint32_t granted = recv_queue_size_for(asked);
    const uint32_t slots = recv_ring_slots_for(granted);
    EXPECT_TRUE(std::has_single_bit(slots)) << asked;
    EXPECT_GE(slots, granted + 8) << asked;
    EXPECT_LE(slots, 2 * granted + 16) << asked;  // no more than the spare slots need
  }
  EXPECT_EQ(recv_ring_slots_for(512), 1024u);
  EXPECT_EQ(recv_ring_slots_for(500), 512u);
}

TEST(QueueSizes, SendWqeOfOneSgeHasInlineRoom) {
  const SendQueueSize rc = send_queue_size_for(IBV_QPT_RC, 16, 1, 0);
  EXPECT_EQ(rc.wqe_bytes, 64u);
  EXPECT_EQ(rc.max_inline_data, 28u);
  EXPECT_EQ(rc.max_send_wr, 16u);
  // UD's address segment makes the WQE two blocks.
  const SendQueueSize ud = send_queue_size_for(IBV_QPT_UD, 16, 1, 0);
  EXPECT_EQ(ud.wqe_bytes, 128u);
  EXPECT_EQ(ud.max_inline_data, 60u);
}

TEST(QueueSizes, SendInlineRoomNeverBelowTheRequest) {
  for (uint32_t sge = 1; sge <= 4; ++sge)
    for (uint32_t asked = 0; asked <= limits::kMaxInlineData; ++asked)
      for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
        const SendQueueSize size = send_queue_size_for(type, 1, sge, asked);
        ASSERT_GE(size.max_inline_data, asked) << "type " << type << " sge " << sge;
        ASSERT_LE(size.max_inline_data, limits::kMaxInlineData);
        ASSERT_EQ(size.wqe_bytes % 64, 0u);
      }
}

TEST(QueueSizes, SendQueueFillsItsPowerOfTwoRing) {
  // 64-byte WQEs: the ring of bit_ceil(n) WQEs.
  EXPECT_EQ(send_queue_size_for(IBV_QPT_RC, 100, 1, 0).max_send_wr, 128u);
  EXPECT_EQ(send_queue_size_for(IBV_QPT_RC, 128, 1, 0).max_send_wr, 128u);
  // 192-byte WQEs (8 SGEs): 128 of them need 24 KiB, a 32 KiB ring holds 170.
  const SendQueueSize big = send_queue_size_for(IBV_QPT_RC, 128, 8, 0);
  EXPECT_EQ(big.wqe_bytes, 192u);
  EXPECT_EQ(big.max_send_wr, 170u);
  EXPECT_EQ(send_queue_size_for(IBV_QPT_RC, 0, 1, 0).max_send_wr, 0u);
  // Never past the device limit, never below the request.
  EXPECT_EQ(send_queue_size_for(IBV_QPT_RC, limits::kMaxQpWr, 8, 0).max_send_wr, uint32_t{limits::kMaxQpWr});
}

}  // namespace
}  // namespace softhca::engine
