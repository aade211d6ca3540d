// The gradient noise scale estimator (train/noise_scale.h): the two unbiased estimators on numbers worked by
// hand, and on synthetic per-example gradients g = G + sigma z (z standard normal, d dimensions) the moving
// average recovers B_simple = d sigma^2 / |G|^2 within 5%.
#include "train/noise_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"

namespace {

using mt::train::NoiseSample;
using mt::train::NoiseScale;

// B_small 2, B_big 8, |g_small|^2 5, |g_big|^2 2: |G|^2 = (8 * 2 - 2 * 5) / 6 = 1, tr = 3 / (1/2 - 1/8) = 8.
TEST(NoiseScale, EstimatorsOnHandWorkedNumbers) {
  const auto e = mt::train::estimate_noise({5.0, 2.0, 2.0, 8.0});
  ASSERT_TRUE(e.valid);
  EXPECT_DOUBLE_EQ(e.g2, 1.0);
  EXPECT_DOUBLE_EQ(e.trace, 8.0);
  EXPECT_FALSE(mt::train::estimate_noise({5.0, 5.0, 8.0, 8.0}).valid);  // one small batch: nothing to compare
  NoiseScale ns(0.5);
  ns.add({5.0, 2.0, 2.0, 8.0});
  EXPECT_DOUBLE_EQ(ns.b_simple(), 8.0);
  ns.add({5.0, 2.0, 2.0, 8.0});  // both averages move alike: the ratio stays
  EXPECT_DOUBLE_EQ(ns.b_simple(), 8.0);
  // |G|^2 = (8 * 1 - 2 * 4) / 6 = 0, tr = 3 / (3/8) = 8. After two adds S = 0.75 * 8 = 6, G = 0.75; the third:
  // S = 0.5 * 6 + 0.5 * 8 = 7, G = 0.5 * 0.75 + 0.5 * 0 = 0.375.
  ns.add({4.0, 1.0, 2.0, 8.0});
  EXPECT_DOUBLE_EQ(ns.trace(), 7.0);
  EXPECT_DOUBLE_EQ(ns.g2(), 0.375);
}

// d = 4096, |G|^2 = d * 0.1^2 = 40.96, sigma = 1: B_simple = 4096 / 40.96 = 100. Each step: 4 small batches
// of 8 examples (the big batch is their 32), as 4 ranks or 4 micro-batches of one rank would see them.
TEST(NoiseScale, RecoversSyntheticNoiseScaleWithinFivePercent) {
  const int d = 4096, b = 8, parts = 4;
  const double g_true = 0.1, sigma = 1.0, want = d * sigma * sigma / (d * g_true * g_true);
  NoiseScale ns;
  for (int step = 0; step < 200; step++) {
    const mt::CounterRng rng(42, "noise-scale/" + std::to_string(step));
    std::vector<double> big(d, 0.0);
    double small_sq = 0;
    for (int p = 0; p < parts; p++) {
      std::vector<double> mean(d, 0.0);
      for (int e = 0; e < b; e++)
        for (int i = 0; i < d; i++) mean[i] += (g_true + sigma * rng.normal((uint64_t)((p * b + e) * d + i))) / b;
      double sq = 0;
      for (int i = 0; i < d; i++) {
        sq += mean[i] * mean[i];
        big[i] += mean[i] / parts;
      }
      small_sq += sq / parts;
    }
    double big_sq = 0;
    for (double x : big) big_sq += x * x;
    ns.add({small_sq, big_sq, (double)b, (double)(b * parts)});
  }
  EXPECT_NEAR(ns.b_simple(), want, 0.05 * want);
  EXPECT_NEAR(ns.g2() / (1 - std::pow(0.95, 200)), d * g_true * g_true, 0.05 * d * g_true * g_true);
}

}  // namespace
