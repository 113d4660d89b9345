// max_qp is what QP creation meets: the reported number of QPs can be
// created, and the next ibv_create_qp fails with ENOMEM. QPNs are host-wide,
// so this fills the whole QPN table: ctest runs it with SOFTHCA_RUNTIME_DIR
// naming a private directory (a registry of its own), so other softhca
// processes of the user are never starved meanwhile.
#include <cstdlib>

#include "loopback.hpp"

namespace loopback {
namespace {

TEST(DeviceLimits, CreateQpBeyondMaxQpIsEnomem) {
  const char* dir = std::getenv("SOFTHCA_RUNTIME_DIR");
  if (dir == nullptr || dir[0] == '\0')
    GTEST_SKIP() << "fills the host's QPN table: run through ctest, which gives it a private SOFTHCA_RUNTIME_DIR";
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &attr), 0);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  QpConfig cfg;
  cfg.type = IBV_QPT_UD;
  cfg.max_send_wr = 1;
  cfg.max_recv_wr = 1;
  cfg.max_send_sge = 1;
  cfg.max_recv_sge = 1;
  std::vector<ibv_qp*> qps;
  qps.reserve(static_cast<size_t>(attr.max_qp));
  for (int i = 0; i < attr.max_qp; ++i) {
    ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
    ASSERT_NE(qp, nullptr) << "qp " << i << ": " << std::strerror(errno);
    qps.push_back(qp);
  }
  errno = 0;
  EXPECT_EQ(create_qp(dev.pd, cq, cq, cfg), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  // A destroyed QP frees its QPN for the next.
  ASSERT_EQ(ibv_destroy_qp(qps.back()), 0);
  qps.back() = create_qp(dev.pd, cq, cq, cfg);
  EXPECT_NE(qps.back(), nullptr) << std::strerror(errno);
  for (ibv_qp* qp : qps) {
    if (qp) {
      ASSERT_EQ(ibv_destroy_qp(qp), 0);
    }
  }
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  // The refused create took no reference on the PD (it used to drop one it
  // never took, leaving the PD busy for ever) and freed nothing twice.
  EXPECT_EQ(ibv_dealloc_pd(dev.pd), 0);
  dev.pd = nullptr;
}

}  // namespace
}  // namespace loopback
