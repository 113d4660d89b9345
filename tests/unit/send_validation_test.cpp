// QueuePair::validate_send answers the common shapes of a send WR (one SGE,
// an ordinary opcode) from two masks, inline on the way of every post, and
// asks validate_send_general for the rest. Both must give the same answer
// for every WR: here, for a grid of WRs that crosses every field the two
// read, on QPs of each connected and datagram type with and without room
// for SGEs and inline data.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/qp/send_wqe.hpp"

namespace softhca::engine {
namespace {

struct Shape {
  ibv_qp_type type;
  uint32_t max_send_sge;
  uint32_t max_inline_data;
};

TEST(SendValidation, CommonShapesAnswerAsTheGeneralQuestionsDo) {
  auto ctx = Context::open();
  ASSERT_TRUE(ctx.has_value());
  auto pd = ProtectionDomain::create(**ctx);
  auto cq = CompletionQueue::create(**ctx, 16, nullptr);
  ASSERT_TRUE(pd.has_value() && cq.has_value());

  const Shape shapes[] = {
      {IBV_QPT_RC, 1, 0}, {IBV_QPT_RC, 2, 64}, {IBV_QPT_RC, 0, 64}, {IBV_QPT_UC, 1, 64},
      {IBV_QPT_UC, 4, 0}, {IBV_QPT_UD, 1, 64}, {IBV_QPT_UD, 2, 0},
  };
  std::vector<uint32_t> opcodes;
  for (uint32_t op = 0; op <= 16; ++op) opcodes.push_back(op);
  for (const uint32_t op : {31u, 32u, 33u, 200u, 0x80000000u}) opcodes.push_back(op);
  const unsigned flag_sets[] = {0,
                                IBV_SEND_SIGNALED,
                                IBV_SEND_INLINE,
                                IBV_SEND_INLINE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED,
                                IBV_SEND_FENCE,
                                kSendFlagAtomicWriteValue,
                                kSendFlagAtomicWriteValue | IBV_SEND_INLINE};
  const int sge_counts[] = {-1, 0, 1, 2, 5};
  const uint32_t lengths[] = {0, 1, 63, 64, 65, 4096};

  int compared = 0;
  int accepted = 0;
  int refused = 0;
  for (const Shape& shape : shapes) {
    QpInitAttr init{};
    init.type = shape.type;
    init.send_cq = *cq;
    init.recv_cq = *cq;
    init.max_send_wr = 4;
    init.max_recv_wr = 4;
    init.max_send_sge = shape.max_send_sge;
    init.max_recv_sge = 1;
    init.max_inline_data = shape.max_inline_data;
    auto qp = QueuePair::create(**ctx, *pd, init);
    ASSERT_TRUE(qp.has_value()) << "type " << shape.type << " max_send_sge " << shape.max_send_sge;
    // The sizes as granted (creation may round them up).
    const QpInitAttr& granted = (*qp)->init_attr();
    ibv_sge sges[5];
    for (const uint32_t opcode : opcodes)
      for (const unsigned flags : flag_sets)
        for (const int num_sge : sge_counts)
          for (const bool with_list : {true, false})
            for (const uint32_t length : lengths) {
              for (ibv_sge& s : sges) s = ibv_sge{0x1000, length, 0x1234};
              ibv_send_wr wr{};
              wr.wr_id = 1;
              // As a C caller may: any number, in or outside the enum's range.
              std::memcpy(&wr.opcode, &opcode, sizeof opcode);
              wr.send_flags = flags;
              wr.num_sge = num_sge;
              wr.sg_list = with_list ? sges : nullptr;
              const int fast = (*qp)->validate_send(wr);
              const int general = (*qp)->validate_send_general(wr);
              ASSERT_EQ(fast, general) << "type " << shape.type << " max_send_sge " << granted.max_send_sge
                                       << " max_inline " << granted.max_inline_data << " opcode " << opcode
                                       << " flags 0x" << std::hex << flags << std::dec << " num_sge " << num_sge
                                       << " list " << with_list << " length " << length;
              ++compared;
              (fast == 0 ? accepted : refused) += 1;
            }
    delete *qp;
  }
  // The grid reaches both answers, the common shapes' included.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_EQ(compared, 7 * 22 * 7 * 5 * 2 * 6);
  delete *cq;
  delete *pd;
  (*ctx)->release();
}

}  // namespace
}  // namespace softhca::engine
