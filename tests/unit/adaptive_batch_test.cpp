// The adaptive batch's rule (train/adaptive_batch.h) on numbers worked by hand, and its accumulation.
#include "train/adaptive_batch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace mt::train;
const double kInf = std::numeric_limits<double>::infinity();

// E(B) = (B_noise + B0) / (B_noise + B): 110 / 120 at B_noise 100, B0 10, B 20; no noise: B0 / B; infinite
// noise: 1.
TEST(AdaptiveBatch, StatisticalEfficiency) {
  EXPECT_DOUBLE_EQ(statistical_efficiency(100, 10, 20), 110.0 / 120.0);
  EXPECT_DOUBLE_EQ(statistical_efficiency(0, 10, 40), 0.25);
  EXPECT_DOUBLE_EQ(statistical_efficiency(-5, 10, 40), 0.25);
  EXPECT_DOUBLE_EQ(statistical_efficiency(kInf, 10, 40), 1.0);
}

// B0 1, t_compute 1, t_exchange 0, t_update 1: G(1) = 1 / 2, G(2) = 2 / 3 (B_noise + 1) / (B_noise + 2), which
// beats G(1) exactly when B_noise > 2. At B_noise 2 they tie (3/4 x 2/3 = 1/2): no growth; at 3, 8/15 > 1/2:
// k doubles.
TEST(AdaptiveBatch, DoublesWhenGoodputImproves) {
  const StepTimes t{1, 0, 1};
  EXPECT_DOUBLE_EQ(goodput(2, 1, 1, t), 0.5);
  EXPECT_DOUBLE_EQ(goodput(3, 1, 2, t), 8.0 / 15.0);
  EXPECT_EQ(choose_batches(2, 1, 1, 8, t), 1);
  EXPECT_EQ(choose_batches(3, 1, 1, 8, t), 2);
  EXPECT_EQ(choose_batches(0, 1, 1, 8, t), 1);     // no noise: a bigger batch only halves the efficiency
  EXPECT_EQ(choose_batches(kInf, 1, 4, 8, t), 8);  // all noise: any throughput gain pays
  EXPECT_EQ(choose_batches(kInf, 1, 8, 8, t), 8);  // never past max
  EXPECT_EQ(choose_batches(kInf, 1, 1, 1, t), 1);
}

// The exchange is paid once per optimizer step, not once per batch. B0 1, t_compute 1, t_exchange 2, t_update 0:
// G(1) = 1 / 3, G(2) = 2 / 4 (B_noise + 1) / (B_noise + 2), above G(1) exactly when B_noise > 1 (at 3: 2/5).
// Charging the exchange k times (T(k) = k / 3k) would make G(2) = G(1) E(2) < G(1) at every B_noise: never grow.
TEST(AdaptiveBatch, ChargesTheExchangeOncePerUpdate) {
  const StepTimes t{1, 2, 0};
  EXPECT_DOUBLE_EQ(goodput(3, 1, 1, t), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(goodput(3, 1, 2, t), 0.4);
  EXPECT_DOUBLE_EQ(goodput(kInf, 1, 4, t), 4.0 / 6.0);
  EXPECT_EQ(choose_batches(3, 1, 1, 8, t), 2);
  EXPECT_EQ(choose_batches(1, 1, 1, 8, t), 1);  // the tie: 2/4 x 2/3 = 1/3
  EXPECT_EQ(choose_batches(0.5, 1, 1, 8, t), 1);
}

// every 1, warmup 1: the first observed update decides k = 2 (infinite noise); the next two gradients are
// averaged into one step with lr x sqrt(2); no decision while a batch is pending.
TEST(AdaptiveBatch, CountsKDataStepsThenSteps) {
  AdaptiveBatch ab({true, 8, 1, 1}, 1.0);
  EXPECT_EQ(ab.position(), 0);
  EXPECT_TRUE(ab.count_data_step());  // k = 1: every data step is an optimizer step
  EXPECT_EQ(ab.position(), 0);
  EXPECT_FLOAT_EQ(ab.lr_scale(), 1.0f);
  ab.observe(0, 1.0, 0.0, 1.0, kInf);
  EXPECT_EQ(ab.k(), 2);
  EXPECT_FALSE(ab.count_data_step());
  EXPECT_EQ(ab.position(), 1);
  ab.observe(1, 1.0, -1.0, -1.0, kInf);  // pending: k stays
  EXPECT_EQ(ab.k(), 2);
  EXPECT_TRUE(ab.count_data_step());
  EXPECT_EQ(ab.position(), 0);
  EXPECT_FLOAT_EQ(ab.lr_scale(), std::sqrt(2.0f));
  ab.observe(2, 1.0, 0.0, 1.0, std::nan(""));  // no estimate: no decision
  EXPECT_EQ(ab.k(), 2);
  ab.observe(3, 1.0, 0.0, 1.0, 0.0);  // no noise: stays (never shrinks either)
  EXPECT_EQ(ab.k(), 2);
}

}  // namespace

namespace {

// decides(s, stepped) says beforehand whether observe will decide (the ranks agree on the times only then):
// every 2 optimizer steps, not before data step warmup - 1 = 2.
TEST(AdaptiveBatch, DecidesExactlyWhenObserveDecides) {
  using namespace mt::train;
  AdaptiveBatch ab({true, 8, 2, 3}, 1.0);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int> said, did;
  for (int s = 0; s < 8; s++) {
    ab.count_data_step();
    const int before = ab.k();
    if (ab.decides(s, true)) said.push_back(s);
    ab.observe(s, 1.0, 0.0, 1.0, s < 4 ? 0.0 : inf);  // B_noise 0 (stays) then infinite (doubles)
    nlohmann::json row;
    ab.annotate(row);
    if (row.contains("goodput_gain")) did.push_back(s);
    if (ab.k() != before) break;  // (k = 2: the next data step is pending)
  }
  EXPECT_EQ(said, (std::vector<int>{3, 5}));
  EXPECT_EQ(did, said);
  EXPECT_FALSE(ab.decides(6, false));
}

}  // namespace
