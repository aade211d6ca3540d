// DGC with AdamW on one rank (optim/dgc_adam.h, parallel/compress/dgc_adam.h): the optimizer is AdamW bit for
// bit before the freeze step and p -= lr (U + wd p) after it, with the preconditioner sqrt(v / (1-b2^K)) + eps
// of the frozen v; the exchange at full density without masking is Adam with the variance frozen
// (U = m / (1-b1^t) / D, m the momentum of the clipped gradients, started from AdamW's), with masking it keeps
// no momentum at full density (U = (1-b1) g / (1-b1^t) / D), and at k = 1 it sends the largest accumulated
// entry and keeps the rest, worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "nn/params.h"
#include "optim/dgc_adam.h"
#include "optim/optimizer.h"
#include "parallel/compress/dgc_adam.h"

namespace {

using mt::compress::CompressSpec;
using mt::compress::DgcAdamExchange;
using mt::compress::DgcAdamStepInputs;
using mt::compress::Method;

CompressSpec topk(double ratio) {
  CompressSpec s;
  s.method = Method::topk;
  s.ratio = ratio;
  return s;
}

std::vector<float> draws(const char* key, size_t n, double scale, double shift = 0.0) {
  const mt::CounterRng rng(7, key);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) out[i] = (float)(shift + scale * rng.normal(i));
  return out;
}

TEST(DgcAdam, AdamWBeforeTheFreezeStepThenTheSentUpdate) {
  const size_t n = 10;
  mt::optim::AdamWConfig adam{0.9f, 0.95f, 1e-8f, 0.1f};
  mt::optim::AdamW ref(n, adam);
  mt::optim::DgcAdam opt(n, mt::optim::DgcAdamConfig{adam, 3});
  std::vector<mt::optim::Segment> segs = {{0, 0, 0, 6, true}, {6, 6, 6, 4, false}};
  std::vector<float> p = draws("p", n, 1.0), q = p;
  for (int64_t s = 0; s < 3; s++) {
    const std::vector<float> g = draws(s == 0 ? "g0" : s == 1 ? "g1" : "g2", n, 0.5);
    ref.scale_next_grads(0.75f);
    opt.scale_next_grads(0.75f);
    ref.step(p.data(), g.data(), segs, 1e-2f, s);
    opt.step(q.data(), g.data(), segs, 1e-2f, s);
    ASSERT_EQ(0, std::memcmp(p.data(), q.data(), sizeof(float) * n)) << "step " << s;
  }
  // The preconditioner of the frozen v: sqrt(v / (1 - b2^3)) + eps with AdamW's v.
  const float* v = ref.state().data(1);
  std::vector<float> D(n);
  opt.preconditioner(D.data(), n);
  const float bc2 = (float)(1.0 - std::pow(0.95, 3.0));
  for (size_t i = 0; i < n; i++) EXPECT_FLOAT_EQ(D[i], std::sqrt(v[i] / bc2) + 1e-8f) << i;
  // After K: p -= lr (U + wd p), wd on the first segment only; the clipping factor is never applied here.
  const std::vector<float> U = draws("U", n, 1.0);
  opt.scale_next_grads(0.5f);
  EXPECT_EQ(opt.take_grad_scale(), 0.5f);  // the exchange takes it (and applies it to the share) before the step
  opt.scale_next_grads(0.5f);              // not taken: the step after K ignores it all the same
  std::vector<float> want = q;
  for (size_t i = 0; i < n; i++) want[i] -= 1e-2f * (U[i] + (i < 6 ? 0.1f : 0.0f) * want[i]);
  opt.step(q.data(), U.data(), segs, 1e-2f, 3);
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(q[i], want[i], 1e-7f) << i;
}

// --dgc-lr-scale S: before K the steps are AdamW's (S unused), from K on p -= (S lr) (U + wd p).
TEST(DgcAdam, LrScaleActsFromTheFreezeStepOn) {
  const size_t n = 10;
  mt::optim::AdamWConfig adam{0.9f, 0.95f, 1e-8f, 0.1f};
  mt::optim::AdamW ref(n, adam);
  mt::optim::DgcAdam opt(n, mt::optim::DgcAdamConfig{adam, 2, 1.5f});
  std::vector<mt::optim::Segment> segs = {{0, 0, 0, 6, true}, {6, 6, 6, 4, false}};
  std::vector<float> p = draws("p", n, 1.0), q = p;
  for (int64_t s = 0; s < 2; s++) {
    const std::vector<float> g = draws(s == 0 ? "g0" : "g1", n, 0.5);
    ref.step(p.data(), g.data(), segs, 1e-2f, s);
    opt.step(q.data(), g.data(), segs, 1e-2f, s);
    ASSERT_EQ(0, std::memcmp(p.data(), q.data(), sizeof(float) * n)) << "step " << s;
  }
  const std::vector<float> U = draws("U", n, 1.0);
  std::vector<float> want = q;
  for (size_t i = 0; i < n; i++) want[i] -= 1.5e-2f * (U[i] + (i < 6 ? 0.1f : 0.0f) * want[i]);
  opt.step(q.data(), U.data(), segs, 1e-2f, 2);
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(q[i], want[i], 1e-7f) << i;
}

// Full density on one rank: every entry is sent every step.
void full_density(bool masking) {
  mt::nn::ParamRegistry p;
  p.add("a", {5}, {}, 0);
  p.add("b", {2, 3}, {}, 0);
  p.finalize();
  const size_t n = p.size();
  DgcAdamExchange ex(p, nullptr, topk(1.0), masking);
  const float b1 = 0.9f;
  const std::vector<float> D = draws("D", n, 0.1, 1.0);  // around 1, positive
  const std::vector<float> m0 = draws("m0", n, 0.3);
  std::vector<double> m(m0.begin(), m0.end());
  for (int64_t s = 4; s < 8; s++) {
    const std::vector<float> g = draws(s % 2 ? "ga" : "gb", n, 1.0, 0.1 * (double)s);
    std::memcpy(p.grad(), g.data(), sizeof(float) * n);
    DgcAdamStepInputs in;
    in.precond = D.data();
    in.m0 = s == 4 ? m0.data() : nullptr;
    in.beta1 = b1;
    in.bc1 = (float)(1.0 - std::pow((double)b1, (double)s + 1.0));
    in.g_scale = 0.5f;
    ex.exchange(p.grad(), in);
    for (size_t i = 0; i < n; i++) {
      const double gi = 0.5 * (double)g[i];
      m[i] = masking ? (1.0 - b1) * gi : b1 * m[i] + (1.0 - b1) * gi;  // masking: u was zeroed last step
      if (masking && s == 4) m[i] = b1 * (double)m0[i] + (1.0 - b1) * gi;
      const double want = m[i] / in.bc1 / D[i];
      EXPECT_NEAR(p.grad()[i], want, 1e-5 * (1.0 + std::fabs(want))) << "step " << s << " element " << i;
    }
    for (size_t t = 0; t < 2; t++)
      for (float a : ex.accumulated(t)) EXPECT_EQ(a, 0.0f);  // everything was sent
    if (masking) {
      for (size_t t = 0; t < 2; t++)
        for (float u : ex.momentum(t)) EXPECT_EQ(u, 0.0f);
    }
  }
}

TEST(DgcAdam, FullDensityWithoutMaskingIsAdamWithTheVarianceFrozen) { full_density(false); }
TEST(DgcAdam, FullDensityWithMaskingKeepsNoMomentum) { full_density(true); }

// One tensor of 4, k = 1 (topk:0.25), b1 = 0.5, D = 1, bc1 = 1 (given), no clipping, m0 = 0. By hand (exact in
// float32):
//   s  g               u = .5 u + .5 g        a = a + u                   sent     u after masking
//   0  [2, 4, -6, 1]   [1, 2, -3, .5]         [1, 2, -3, .5]              2: -3    [1, 2, 0, .5]
//   1  [2, 2, 2, 2]    [1.5, 2, 1, 1.25]      [2.5, 4, 1, 1.75]           1: 4     [1.5, 0, 1, 1.25]
// without masking step 1 has u = [1.5, 2, -.5, 1.25], a = [2.5, 4, -.5, 1.75]: also entry 1, and a differs at 2.
TEST(DgcAdam, TopOneWorkedByHand) {
  for (bool masking : {true, false}) {
    mt::nn::ParamRegistry p;
    p.add("w", {4}, {}, 0);
    p.finalize();
    DgcAdamExchange ex(p, nullptr, topk(0.25), masking);
    const std::vector<float> D(4, 1.0f), zero(4, 0.0f);
    const std::vector<std::vector<float>> g = {{2, 4, -6, 1}, {2, 2, 2, 2}};
    const std::vector<std::vector<float>> sent = {{0, 0, -3, 0}, {0, 4, 0, 0}};
    const std::vector<std::vector<float>> a_after = {{1, 2, 0, 0.5f},
                                                     {2.5f, 0, masking ? 1.0f : -0.5f, 1.75f}};
    const std::vector<std::vector<float>> u_after = {{1, 2, masking ? 0.0f : -3.0f, 0.5f},
                                                     {1.5f, masking ? 0.0f : 2.0f, masking ? 1.0f : -0.5f, 1.25f}};
    for (int s = 0; s < 2; s++) {
      std::memcpy(p.grad(), g[s].data(), sizeof(float) * 4);
      DgcAdamStepInputs in;
      in.precond = D.data();
      in.m0 = s == 0 ? zero.data() : nullptr;
      in.beta1 = 0.5f;
      in.bc1 = 1.0f;
      ex.exchange(p.grad(), in);
      for (int i = 0; i < 4; i++) {
        EXPECT_EQ(p.grad()[i], sent[s][i]) << "masking " << masking << " step " << s << " element " << i;
        EXPECT_EQ(ex.accumulated(0)[i], a_after[s][i]) << "masking " << masking << " step " << s << " a " << i;
        EXPECT_EQ(ex.momentum(0)[i], u_after[s][i]) << "masking " << masking << " step " << s << " u " << i;
      }
    }
  }
}

// --dgc-global-topk with --dgc-dense-vectors: matrices A [2, 2] and B [2, 3] are one group of 10 entries (A's
// then B's), k = ceil(0.2 x 10) = 2 for the group; vector V [2] is sent whole. b1 = 0 (u = g), D = 1, bc1 = 1.
//   step 0: A = [5, -1, .5, -7], B = [1, 2, -3, .25, 4, -2], V = [9, -9]: the two largest |a| are both in A
//           (-7, 5), so B sends nothing (per tensor it would send 4 and -3); V whole.
//   step 1: g = 0: a unchanged, the largest are now B's 4 and -3, A sends nothing.
TEST(DgcAdam, GlobalTopKOneThresholdOverTheMatrices) {
  mt::nn::ParamRegistry p;
  p.add("A", {2, 2}, {}, 0);
  p.add("B", {2, 3}, {}, 0);
  p.add("V", {2}, {}, 0);
  p.finalize();
  DgcAdamExchange ex(p, nullptr, topk(0.2), /*masking=*/true, /*dense_vectors=*/true, /*global_topk=*/true);
  const std::vector<float> D(12, 1.0f), zero(12, 0.0f);
  const std::vector<std::vector<float>> g = {{5, -1, 0.5f, -7, 1, 2, -3, 0.25f, 4, -2, 9, -9},
                                             std::vector<float>(12, 0.0f)};
  const std::vector<std::vector<float>> sent = {{5, 0, 0, -7, 0, 0, 0, 0, 0, 0, 9, -9},
                                                {0, 0, 0, 0, 0, 0, -3, 0, 4, 0, 0, 0}};
  // A, B and V's accumulated update after each step, and the momentum (masked where sent, V never)
  const std::vector<std::vector<float>> a_after = {{0, -1, 0.5f, 0, 1, 2, -3, 0.25f, 4, -2, 0, 0},
                                                   {0, -1, 0.5f, 0, 1, 2, 0, 0.25f, 0, -2, 0, 0}};
  const std::vector<std::vector<float>> u_after = {{0, -1, 0.5f, 0, 1, 2, -3, 0.25f, 4, -2, 9, -9},
                                                   {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
  const size_t off[3] = {0, 4, 10}, n[3] = {4, 6, 2};
  for (int s = 0; s < 2; s++) {
    std::memcpy(p.grad(), g[s].data(), sizeof(float) * 12);
    DgcAdamStepInputs in;
    in.precond = D.data();
    in.m0 = s == 0 ? zero.data() : nullptr;
    in.beta1 = 0.0f;
    in.bc1 = 1.0f;
    ex.exchange(p.grad(), in);
    for (size_t t = 0; t < 3; t++)
      for (size_t i = 0; i < n[t]; i++) {
        EXPECT_EQ(p.grad()[off[t] + i], sent[s][off[t] + i]) << "step " << s << " tensor " << t << " element " << i;
        EXPECT_EQ(ex.accumulated(t)[i], a_after[s][off[t] + i]) << "step " << s << " tensor " << t << " a " << i;
        EXPECT_EQ(ex.momentum(t)[i], u_after[s][off[t] + i]) << "step " << s << " tensor " << t << " u " << i;
      }
  }
}

}  // namespace
