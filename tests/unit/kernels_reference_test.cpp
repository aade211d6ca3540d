// Fast element-wise kernels (src/nn: fused, vectorized, threaded) against the plain references in
// src/nn/reference.cpp, at 1 and 2 threads, on sizes that are not multiples of the SIMD width or of
// attention's 64-row tiles. Tolerances are float32 rounding of the sums involved (the fast kernels
// reassociate sums and use a polynomial exp/tanh within ~2 ulp of libm); each is stated where used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/reference.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "tensor/vmath.h"
#include "tests/unit/gradcheck.h"

using mt::testing::randn;

namespace {

// |a - b| <= atol + rtol * |b| for every element.
void expect_close(const std::string& what, const float* a, const float* b, size_t n, double atol, double rtol) {
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!(std::fabs((double)a[i] - b[i]) <= atol + rtol * std::fabs((double)b[i]))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: fast " << a[i] << " vs reference " << b[i];
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements differ";
}

class KernelsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { mt::set_num_threads(GetParam()); }
  void TearDown() override { mt::set_num_threads(1); }
};

}  // namespace

TEST_P(KernelsTest, LayerNormForwardBackward) {
  for (int C : {67, 384}) {
    const int N = 37;
    auto x = randn((size_t)N * C, 1, "x", 2.0f), w = randn(C, 2, "w"), b = randn(C, 3, "b");
    for (float& v : x) v += 0.5f;  // a nonzero mean
    std::vector<float> o1(N * C), o2(N * C), m1(N), m2(N), r1(N), r2(N);
    mt::nn::layernorm_forward(o1.data(), m1.data(), r1.data(), x.data(), w.data(), b.data(), N, C);
    mt::nn::ref::layernorm_forward(o2.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C);
    // Outputs are O(1): sums of C terms reassociated, ~C * 6e-8 relative.
    expect_close("layernorm out", o1.data(), o2.data(), o1.size(), 1e-5, 1e-5);
    expect_close("layernorm mean", m1.data(), m2.data(), N, 1e-6, 1e-5);
    expect_close("layernorm rstd", r1.data(), r2.data(), N, 0, 1e-5);

    auto dout = randn((size_t)N * C, 4, "dout"), dx0 = randn((size_t)N * C, 5, "dx0");
    auto dw0 = randn(C, 6, "dw0"), db0 = randn(C, 7, "db0");
    auto dx1 = dx0, dx2 = dx0, dw1 = dw0, dw2 = dw0, db1 = db0, db2 = db0;
    mt::nn::layernorm_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), m2.data(),
                               r2.data(), N, C);
    mt::nn::ref::layernorm_backward(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), m2.data(),
                                    r2.data(), N, C);
    expect_close("layernorm dinp (accumulated)", dx1.data(), dx2.data(), dx1.size(), 1e-5, 1e-5);
    expect_close("layernorm dw (accumulated)", dw1.data(), dw2.data(), C, 1e-5, 1e-5);
    expect_close("layernorm db (accumulated)", db1.data(), db2.data(), C, 1e-5, 1e-5);
  }
}

TEST_P(KernelsTest, Gelu) {
  const size_t n = 1001;
  auto x = randn(n, 8, "x", 3.0f), dout = randn(n, 9, "dout");
  std::vector<float> y1(n), y2(n), d1(n), d2(n);
  mt::nn::gelu_forward(y1.data(), x.data(), n);
  mt::nn::ref::gelu_forward(y2.data(), x.data(), n);
  // fast_tanh is within ~1e-7 absolute of tanh; GELU multiplies by 0.5 x (|x| <~ 12 here).
  expect_close("gelu", y1.data(), y2.data(), n, 1e-6, 1e-6);
  mt::nn::gelu_backward(d1.data(), x.data(), dout.data(), n);
  mt::nn::ref::gelu_backward(d2.data(), x.data(), dout.data(), n);
  // In the tails (|x| > 3) 1 - t^2 cancels: tanh's ~1e-7 absolute error becomes ~1e-6 of a derivative that
  // is itself ~1e-5, times |dout| <~ 3 and the 0.5 x (1 + 3c x^2) factor: 1e-5 absolute.
  expect_close("gelu backward", d1.data(), d2.data(), n, 1e-5, 1e-5);
}

TEST_P(KernelsTest, SoftmaxCrossEntropyOnePass) {
  for (int V : {1000, 8192}) {
    const int N = 13;
    auto logits = randn((size_t)N * V, 10, "logits", 3.0f);
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; n++) targets[n] = (n * 7919) % V;
    auto l1 = logits, l2 = logits;
    std::vector<float> loss1(N), loss2(N);
    const float dscale = 1.0f / N;
    double t1 = mt::nn::softmax_cross_entropy(l1.data(), targets.data(), N, V, dscale, loss1.data());
    double t2 = mt::nn::ref::softmax_cross_entropy(l2.data(), targets.data(), N, V, dscale, loss2.data());
    // Losses ~ log V: a float32 sum of V exps is good to ~V * 6e-8 relative at worst.
    EXPECT_NEAR(t1, t2, 1e-4 * N) << "V " << V;
    expect_close("cross-entropy losses", loss1.data(), loss2.data(), N, 1e-4, 1e-5);
    // Gradients: p * dscale, tiny for most entries; relative error of the exp and the sum.
    expect_close("cross-entropy dlogits", l1.data(), l2.data(), l1.size(), 1e-9, 1e-4);
  }
}

TEST_P(KernelsTest, CausalAttentionForwardBackward) {
  const int B = 2, T = 70, C = 32, H = 4;  // T: one full 64-row tile and a partial one
  auto qkv = randn((size_t)B * T * 3 * C, 11, "qkv"), dout = randn((size_t)B * T * C, 12, "dout");
  std::vector<float> y1(B * T * C), y2(B * T * C), a1((size_t)B * H * T * T), a2((size_t)B * H * T * T);
  mt::nn::attention_forward(y1.data(), a1.data(), qkv.data(), B, T, C, H);
  mt::nn::ref::attention_forward(y2.data(), a2.data(), qkv.data(), B, T, C, H);
  expect_close("attention probabilities", a1.data(), a2.data(), a1.size(), 1e-6, 1e-5);
  expect_close("attention out", y1.data(), y2.data(), y1.size(), 1e-5, 1e-5);
  std::vector<float> d1(qkv.size()), d2(qkv.size());
  mt::nn::attention_backward(d1.data(), dout.data(), qkv.data(), a2.data(), B, T, C, H);
  mt::nn::ref::attention_backward(d2.data(), dout.data(), qkv.data(), a2.data(), B, T, C, H);
  expect_close("attention dqkv", d1.data(), d2.data(), d1.size(), 1e-5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Threads, KernelsTest, ::testing::Values(1, 2));

// Clipping fused into the update: a step with scale_next_grads(f) on g is bit-identical to a step on the
// float32 product g * f, and the scale applies to that one step only.
TEST(VectorMath, MaxOfIsTheLargestElementAtEveryLengthAndPosition) {
  // Lengths around the 16-lane blocks, the maximum in the blocks, in the tail and at 0; negative values
  // only (a start at 0 would hide a lane initialized to 0).
  for (int n = 1; n <= 70; n++) {
    auto x = randn(n, n, "max_of");
    for (float& v : x) v = -1.0f - std::fabs(v);
    for (int at : {0, n / 2, n - 1}) {
      std::vector<float> y = x;
      y[at] = -0.5f;
      EXPECT_EQ(mt::max_of(y.data(), n), -0.5f) << "n " << n << " max at " << at;
      EXPECT_EQ(mt::max_of(y.data(), n), *std::max_element(y.begin(), y.end())) << n;
    }
  }
  std::vector<float> z(33, -2.0f);
  z[20] = std::nanf("");
  z[31] = 3.0f;
  EXPECT_EQ(mt::max_of(z.data(), 33), 3.0f) << "a NaN after the first element is skipped, as std::max skips it";
}

TEST(OptimizerFusedScale, AdamWAndSgdEqualPrescaledGradients) {
  const size_t n = 203;
  auto p0 = randn(n, 13, "p"), g = randn(n, 14, "g");
  std::vector<mt::optim::Segment> segs = {{0, 0, 0, 100, true}, {100, 100, 100, n - 100, false}};
  const float f = 0.3712f;
  std::vector<float> gf(n);
  for (size_t i = 0; i < n; i++) gf[i] = g[i] * f;
  for (int kind = 0; kind < 2; kind++) {
    std::unique_ptr<mt::optim::Optimizer> fused, plain;
    if (kind == 0) {
      fused = std::make_unique<mt::optim::AdamW>(n, mt::optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
      plain = std::make_unique<mt::optim::AdamW>(n, mt::optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
    } else {
      fused = std::make_unique<mt::optim::Sgd>(n, mt::optim::SgdConfig{0.9f, 0.1f});
      plain = std::make_unique<mt::optim::Sgd>(n, mt::optim::SgdConfig{0.9f, 0.1f});
    }
    auto p1 = p0, p2 = p0;
    fused->scale_next_grads(f);
    fused->step(p1.data(), g.data(), segs, 0.01f, 0);
    plain->step(p2.data(), gf.data(), segs, 0.01f, 0);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(p1[i], p2[i]) << "kind " << kind << " step 0 element " << i;
    fused->step(p1.data(), g.data(), segs, 0.01f, 1);  // scale reset: plain gradients
    plain->step(p2.data(), g.data(), segs, 0.01f, 1);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(p1[i], p2[i]) << "kind " << kind << " step 1 element " << i;
  }
}
