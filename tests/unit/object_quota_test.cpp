// engine::ObjectQuota: the per-process count behind max_cq, max_srq and
// max_pd, checked at its edge.
#include "engine/object_quota.hpp"

#include <gtest/gtest.h>

#include "common/limits.hpp"

namespace softhca::engine {
namespace {

TEST(ObjectQuota, TakesExactlyMaxThenRefuses) {
  ObjectQuota quota(3);
  EXPECT_TRUE(quota.try_take());
  EXPECT_TRUE(quota.try_take());
  EXPECT_TRUE(quota.try_take());
  EXPECT_EQ(quota.live(), 3u);
  EXPECT_FALSE(quota.try_take());
  EXPECT_FALSE(quota.try_take());
  EXPECT_EQ(quota.live(), 3u);  // a refusal takes nothing
  quota.give_back();
  EXPECT_TRUE(quota.try_take());
  EXPECT_FALSE(quota.try_take());
}

TEST(ObjectQuota, ZeroRefusesEverything) {
  ObjectQuota quota(0);
  EXPECT_FALSE(quota.try_take());
  EXPECT_EQ(quota.live(), 0u);
}

TEST(ObjectQuota, DeviceLimitsAreWhatTheQuotasHold) {
  ObjectQuota cq(limits::kMaxCq);
  for (int i = 0; i < limits::kMaxCq; ++i) ASSERT_TRUE(cq.try_take()) << i;
  EXPECT_FALSE(cq.try_take());
  EXPECT_EQ(cq.max(), static_cast<uint32_t>(limits::kMaxCq));
}

}  // namespace
}  // namespace softhca::engine
