// Crossbow's SMA rule (train/sma.h) on numbers worked by hand (small integers and halves: every float32
// operation below is exact, so the comparisons are exact).
#include "train/sma.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

// Two learners, alpha 1/2, z = [2, 0]. Learner 0: w = [4, 2], after its optimizer step [3, 1]:
// c = 1/2 ([4, 2] - [2, 0]) = [1, 1] -> w = [2, 0]. Learner 1: w = [0, -2], after [1, -1]:
// c = 1/2 ([0, -2] - [2, 0]) = [-1, -1] -> w = [2, 0]. csum = [0, 0].
TEST(Sma, CorrectionPullsEachLearnerTowardTheCenter) {
  std::vector<float> z{2, 0}, csum{0, 0};
  std::vector<float> w0{4, 2}, n0{3, 1}, w1{0, -2}, n1{1, -1};
  mt::train::sma_correct(n0.data(), w0.data(), z.data(), 0.5f, csum.data(), 2);
  EXPECT_EQ(n0, (std::vector<float>{2, 0}));
  EXPECT_EQ(csum, (std::vector<float>{1, 1}));
  mt::train::sma_correct(n1.data(), w1.data(), z.data(), 0.5f, csum.data(), 2);
  EXPECT_EQ(n1, (std::vector<float>{2, 0}));
  EXPECT_EQ(csum, (std::vector<float>{0, 0}));
}

// z = [2, 4], z_prev = [1, 4], csum = [1, -2], mu 1/2: z = z + csum + mu (z - z_prev) = [2 + 1 + 0.5, 4 - 2 + 0]
// = [3.5, 2]; z_prev becomes the old z. A second call with csum 0: [3.5 + 0.75, 2 - 1] = [4.25, 1].
TEST(Sma, CenterTakesTheCorrectionsAndItsMomentum) {
  std::vector<float> z{2, 4}, zp{1, 4}, csum{1, -2};
  mt::train::sma_center(z.data(), zp.data(), csum.data(), 0.5f, 2);
  EXPECT_EQ(z, (std::vector<float>{3.5f, 2}));
  EXPECT_EQ(zp, (std::vector<float>{2, 4}));
  std::vector<float> none{0, 0};
  mt::train::sma_center(z.data(), zp.data(), none.data(), 0.5f, 2);
  EXPECT_EQ(z, (std::vector<float>{4.25f, 1}));
  EXPECT_EQ(zp, (std::vector<float>{3.5f, 2}));
}

// alpha 0, mu 0: the learner keeps its optimizer's result and the center stays where it is.
TEST(Sma, AlphaZeroIsPlainTraining) {
  std::vector<float> z{1, 1}, zp{1, 1}, csum{0, 0}, w{5, -3}, n{4, -2};
  mt::train::sma_correct(n.data(), w.data(), z.data(), 0.0f, csum.data(), 2);
  EXPECT_EQ(n, (std::vector<float>{4, -2}));
  mt::train::sma_center(z.data(), zp.data(), csum.data(), 0.0f, 2);
  EXPECT_EQ(z, (std::vector<float>{1, 1}));
}

}  // namespace
