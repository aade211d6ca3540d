// Optimizers, LR schedule and clipping against the formulas written out in double.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optimizer.h"

using mt::optim::Segment;

TEST(AdamW, MatchesFormulaOverSeveralSteps) {
  const size_t n = 4;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.1f};
  std::vector<double> pd(p.begin(), p.end()), m(n, 0), v(n, 0);
  mt::optim::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  mt::optim::AdamW opt(n, cfg);
  // Elements 0-1 are one tensor with decay, 2-3 one without.
  std::vector<Segment> segs = {{0, 0, 0, 2, true}, {2, 2, 2, 2, false}};
  for (int s = 0; s < 5; s++) {
    std::vector<float> g = {0.3f * (s + 1), -0.2f, 0.05f * s, 1.0f};
    float lr = 0.01f * (s + 1);
    opt.step(p.data(), g.data(), segs, lr, s);
    double t = s + 1;
    for (size_t i = 0; i < n; i++) {
      double wd = i < 2 ? 0.1 : 0.0;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * (double)g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.95, t));
      pd[i] -= (double)lr * (mhat / (std::sqrt(vhat) + 1e-8) + wd * pd[i]);
      EXPECT_NEAR(p[i], pd[i], 1e-6) << "step " << s << " element " << i;
    }
  }
}

TEST(Sgd, MomentumAndDecay) {
  std::vector<float> p = {1.0f, 1.0f};
  mt::optim::Sgd opt(2, {0.9f, 0.5f});
  std::vector<Segment> segs = {{0, 0, 0, 1, true}, {1, 1, 1, 1, false}};
  std::vector<float> g = {1.0f, 1.0f};
  opt.step(p.data(), g.data(), segs, 0.1f, 0);  // buf = g + wd p = 1.5 | 1
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.1f * 1.5f);
  EXPECT_FLOAT_EQ(p[1], 0.9f);
  opt.step(p.data(), g.data(), segs, 0.1f, 1);  // buf = 0.9*1.5 + 1 + 0.5*0.85
  EXPECT_NEAR(p[0], 0.85 - 0.1 * (0.9 * 1.5 + 1 + 0.5 * 0.85), 1e-6);
  EXPECT_NEAR(p[1], 0.9 - 0.1 * (0.9 * 1 + 1), 1e-6);
}

TEST(LrSchedule, WarmupThenCosine) {
  mt::optim::LrSchedule s{1e-3, 1e-4, 10, 110};
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);   // (0+1)/10 of lr
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);   // end of warmup
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);  // cosine starts at the peak
  EXPECT_FLOAT_EQ(s.at(60), (float)(1e-4 + 0.9e-3 * 0.5));  // half way: cos(pi/2) = 0
  EXPECT_NEAR(s.at(109), 1e-4 + 0.9e-3 * (1 + std::cos(M_PI * 99 / 100)) / 2, 1e-10);
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);
  mt::optim::LrSchedule none{5e-4, 0, 0, 4};
  EXPECT_FLOAT_EQ(none.at(0), 5e-4f);
}

TEST(Clip, GlobalNorm) {
  std::vector<float> g = {3.0f, 4.0f, 0.0f};
  double norm = mt::optim::global_norm(g.data(), g.size());
  EXPECT_DOUBLE_EQ(norm, 5.0);
  float f = mt::optim::clip_by_global_norm(g.data(), g.size(), norm, 1.0);
  EXPECT_NEAR(f, 1.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(g[0], 3.0 / 5.0, 1e-6);
  EXPECT_NEAR(mt::optim::global_norm(g.data(), 3), 1.0, 1e-6);
  std::vector<float> small = {0.1f};
  EXPECT_EQ(mt::optim::clip_by_global_norm(small.data(), 1, 0.1, 1.0), 1.0f);
  EXPECT_EQ(small[0], 0.1f);
}

// A ZeRO shard: the optimizer updates a slice of the parameters from a compact gradient and state buffer
// exactly as the full optimizer updates that slice.
TEST(AdamW, ShardedSegmentsMatchFullUpdate) {
  std::vector<float> p_full = {1, 2, 3, 4, 5, 6}, g_full = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f};
  std::vector<float> p_shard = p_full;
  mt::optim::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  mt::optim::AdamW full(6, cfg), shard(3, cfg);
  std::vector<Segment> all = {{0, 0, 0, 4, true}, {4, 4, 4, 2, false}};
  // This rank owns elements [2, 5): grads arrive compact, state is compact.
  std::vector<float> g_compact = {g_full[2], g_full[3], g_full[4]};
  std::vector<Segment> mine = {{2, 0, 0, 2, true}, {4, 2, 2, 1, false}};
  for (int s = 0; s < 3; s++) {
    full.step(p_full.data(), g_full.data(), all, 0.01f, s);
    shard.step(p_shard.data(), g_compact.data(), mine, 0.01f, s);
  }
  for (int i = 2; i < 5; i++) EXPECT_EQ(p_shard[i], p_full[i]) << i;
  EXPECT_EQ(p_shard[0], 1.0f);  // not owned: untouched
}
