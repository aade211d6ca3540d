// LAMB (optim/lamb.h) against the formulas written out in double: the trust ratio, decay only on tensors of
// >= 2 dims, whole-tensor norms over pieces that cut the tensors, the clipping scale.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/lamb.h"
#include "stat_phase.h"

namespace {

using mt::optim::Lamb;
using mt::optim::LambConfig;

TEST(Lamb, TrustRatio) {
  EXPECT_EQ(Lamb::trust_ratio(2.0, 4.0), 0.5);
  EXPECT_EQ(Lamb::trust_ratio(0.0, 4.0), 1.0);
  EXPECT_EQ(Lamb::trust_ratio(2.0, 0.0), 1.0);
  EXPECT_EQ(Lamb::trust_ratio(0.0, 0.0), 1.0);
}

// A [4, 4] tensor of 0.5 (|w| = 2) and a gradient of +-1: with beta1 = beta2 = 1/2 and eps 0 the first step's
// r is exactly +-1, so |r| = 4 and the trust ratio 0.5: each weight moves by lr / 2. The second tensor is the
// same with zero weights: |w| = 0 gives trust 1, a full step lr.
TEST(Lamb, FirstStepMovesByTheTrustRatio) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {4, 4});
  reg.add("z", {4, 4});
  reg.finalize();
  float* p = reg.data();
  float* g = reg.grad();
  for (int i = 0; i < 16; i++) p[i] = 0.5f, p[16 + i] = 0.0f;
  for (int i = 0; i < 32; i++) g[i] = (i % 3 == 0) ? -1.0f : 1.0f;
  Lamb opt(32, LambConfig{0.5f, 0.5f, 0.0f, 0.0f});
  mt::test::step_with_stats(opt, reg, mt::optim::segments_of(reg), p, g, 0.25f, 0);
  for (int i = 0; i < 16; i++) {
    EXPECT_EQ(p[i], 0.5f - 0.125f * g[i]) << "w[" << i << "]: trust 0.5";
    EXPECT_EQ(p[16 + i], -0.25f * g[16 + i]) << "z[" << i << "]: |w| = 0, trust 1";
  }
}

// Several steps of a [3, 5] matrix (decay) and a [6] vector (no decay), each cut into pieces, against LAMB
// in double over whole tensors; step 2 uses a clipping scale.
TEST(Lamb, PiecesMatchWholeTensorFormulaOverSteps) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {3, 5});
  reg.add("b", {6});
  reg.finalize();
  const size_t n = reg.size();
  float* p = reg.data();
  float* g = reg.grad();
  for (size_t i = 0; i < n; i++) p[i] = 0.1f * (float)((int)(i * 7 % 11) - 5);
  std::vector<double> pd(p, p + n), m(n, 0), v(n, 0);
  const LambConfig cfg{0.9f, 0.95f, 1e-6f, 0.1f};
  Lamb opt(n, cfg);
  const auto segs = mt::test::cut_pieces(reg, {{4, 11}, {1}});
  for (int s = 0; s < 5; s++) {
    for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)((int)((i + 3 * s) * 5 % 13) - 6);
    const float scale = s == 2 ? 0.5f : 1.0f;
    if (s == 2) opt.scale_next_grads(scale);
    const float lr = 0.01f * (float)(s + 1);
    mt::test::step_with_stats(opt, reg, segs, p, g, lr, s);
    const double t = s + 1;
    for (auto [lo, hi, wd] : {std::tuple<size_t, size_t, double>{0, 15, 0.1}, {15, 21, 0.0}}) {
      std::vector<double> r(n);
      double ww = 0, rr = 0;
      for (size_t i = lo; i < hi; i++) {
        const double gi = (double)g[i] * scale;
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.95 * v[i] + 0.05 * gi * gi;
        r[i] = m[i] / (1 - std::pow(0.9, t)) / (std::sqrt(v[i] / (1 - std::pow(0.95, t))) + 1e-6) + wd * pd[i];
        ww += pd[i] * pd[i];
        rr += r[i] * r[i];
      }
      const double trust = ww == 0 || rr == 0 ? 1.0 : std::sqrt(ww) / std::sqrt(rr);
      for (size_t i = lo; i < hi; i++) {
        pd[i] -= lr * trust * r[i];
        EXPECT_NEAR(p[i], pd[i], 2e-6) << "step " << s << " element " << i;
      }
    }
  }
}

// Decay applies to the >= 2-dim tensor only: with a zero gradient the moments stay 0, r = wd w, |r| = wd |w|
// and trust 1 / wd, so a decayed tensor moves by lr w (a full relative step) and an undecayed one not at all.
TEST(Lamb, DecayOnlyOnMatrices) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {2, 2});
  reg.add("b", {4});
  reg.finalize();
  float* p = reg.data();
  for (int i = 0; i < 8; i++) p[i] = 1.0f + (float)i;
  Lamb opt(8, LambConfig{0.9f, 0.95f, 1e-8f, 0.5f});
  mt::test::step_with_stats(opt, reg, mt::optim::segments_of(reg), p, reg.grad(), 0.125f, 0);
  for (int i = 0; i < 4; i++) EXPECT_FLOAT_EQ(p[i], (1.0f + i) * (1.0f - 0.125f)) << "w[" << i << "]";
  for (int i = 4; i < 8; i++) EXPECT_EQ(p[i], 1.0f + i) << "b[" << i - 4 << "]";
}

}  // namespace

namespace {

TEST(Lamb, FusedClipScaleEqualsPrescaledGradients) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {7, 9});
  reg.add("b", {9});
  reg.finalize();
  EXPECT_EQ(mt::test::fused_scale_mismatch(reg, [&] { return std::make_unique<Lamb>(reg.size(), LambConfig{0.9f, 0.95f, 1e-8f, 0.1f}); }), -1)
      << "(index >= n: the step after)";
}

}  // namespace
