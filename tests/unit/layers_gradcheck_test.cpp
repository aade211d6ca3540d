// Finite-difference gradient checks of every layer kernel in nn/layers.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "nn/layers.h"
#include "tests/unit/gradcheck.h"

using mt::testing::dot;
using mt::testing::expect_grad;
using mt::testing::randn;

TEST(LayersGradcheck, Linear) {
  const int N = 5, C = 7, OC = 6;
  auto x = randn(N * C, 1, "x"), W = randn(C * OC, 1, "W", 0.5f), b = randn(OC, 1, "b"), R = randn(N * OC, 1, "R");
  std::vector<float> out(N * OC);
  auto loss = [&] {
    mt::nn::linear_forward(out.data(), x.data(), W.data(), b.data(), N, C, OC);
    return dot(out.data(), R);
  };
  std::vector<float> dx(N * C, 0), dW(C * OC, 0), db(OC, 0);
  loss();
  mt::nn::linear_backward(dx.data(), dW.data(), db.data(), R.data(), x.data(), W.data(), N, C, OC);
  expect_grad("dx", x, dx, loss);
  expect_grad("dW", W, dW, loss);
  expect_grad("db", b, db, loss);
}

TEST(LayersGradcheck, LinearResidualAndAccumulation) {
  const int N = 3, C = 4, OC = 5;
  auto x = randn(N * C, 2, "x"), W = randn(C * OC, 2, "W"), res = randn(N * OC, 2, "res");
  std::vector<float> out(N * OC), plain(N * OC);
  mt::nn::linear_forward(out.data(), x.data(), W.data(), nullptr, N, C, OC, res.data());
  mt::nn::linear_forward(plain.data(), x.data(), W.data(), nullptr, N, C, OC);
  for (int i = 0; i < N * OC; i++) EXPECT_NEAR(out[i], plain[i] + res[i], 1e-5f);
  // Parameter gradients accumulate: two backward calls give twice the gradient.
  std::vector<float> dW1(C * OC, 0), dW2(C * OC, 0), dx(N * C);
  auto R = randn(N * OC, 2, "R");
  mt::nn::linear_backward(dx.data(), dW1.data(), nullptr, R.data(), x.data(), W.data(), N, C, OC);
  mt::nn::linear_backward(dx.data(), dW2.data(), nullptr, R.data(), x.data(), W.data(), N, C, OC);
  mt::nn::linear_backward(dx.data(), dW2.data(), nullptr, R.data(), x.data(), W.data(), N, C, OC);
  for (int i = 0; i < C * OC; i++) EXPECT_FLOAT_EQ(dW2[i], 2 * dW1[i]);
}

TEST(LayersGradcheck, Embedding) {
  const int N = 6, C = 4, rows = 5;
  std::vector<int32_t> ids = {0, 3, 3, 1, 4, 3};  // repeated ids must accumulate
  auto table = randn(rows * C, 3, "table"), R = randn(N * C, 3, "R");
  std::vector<float> out(N * C);
  auto loss = [&] {
    mt::nn::embedding_forward(out.data(), ids.data(), table.data(), N, C, false);
    return dot(out.data(), R);
  };
  std::vector<float> dtable(rows * C, 0);
  mt::nn::embedding_backward(dtable.data(), R.data(), ids.data(), N, C);
  expect_grad("dtable", table, dtable, loss);
  EXPECT_EQ(dtable[2 * C], 0.0f);  // row 2 is never looked up
}

TEST(LayersGradcheck, LayerNorm) {
  const int N = 4, C = 9;
  auto x = randn(N * C, 4, "x", 2.0f), w = randn(C, 4, "w"), b = randn(C, 4, "b"), R = randn(N * C, 4, "R");
  for (int i = 0; i < N * C; i++) x[i] += 0.5f;  // non-zero mean
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    mt::nn::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out.data(), R);
  };
  loss();
  std::vector<float> dx(N * C, 0), dw(C, 0), db(C, 0);
  mt::nn::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(),
                             N, C);
  expect_grad("dx", x, dx, loss);
  expect_grad("dw", w, dw, loss);
  expect_grad("db", b, db, loss);
  // Forward against the definition, in double.
  loss();  // out is stale after the last perturbation
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[n * C + c], (x[n * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c], 1e-5);
  }
}

TEST(LayersGradcheck, Gelu) {
  const size_t n = 200;
  auto x = randn(n, 5, "x", 3.0f), R = randn(n, 5, "R");
  std::vector<float> out(n);
  auto loss = [&] {
    mt::nn::gelu_forward(out.data(), x.data(), n);
    return dot(out.data(), R);
  };
  loss();
  for (size_t i = 0; i < n; i++) {  // against the tanh form in double
    double v = x[i];
    double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], ref, 2e-6 * std::max(1.0, std::fabs(ref))) << "x=" << v;
  }
  std::vector<float> dx(n);
  mt::nn::gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_grad("dx", x, dx, loss, {}, 1e-3f);
}

TEST(LayersGradcheck, Relu) {
  const size_t n = 50;
  auto x = randn(n, 6, "x"), R = randn(n, 6, "R");
  for (auto& v : x)
    if (std::fabs(v) < 0.05f) v = 0.3f;  // keep away from the kink
  std::vector<float> out(n);
  auto loss = [&] {
    mt::nn::relu_forward(out.data(), x.data(), n);
    return dot(out.data(), R);
  };
  loss();
  std::vector<float> dx(n);
  mt::nn::relu_backward(dx.data(), out.data(), R.data(), n);
  expect_grad("dx", x, dx, loss);
}

// T = 70 spans two 64-row causal tiles, so both the diagonal and off-diagonal tile paths are checked.
TEST(LayersGradcheck, CausalAttention) {
  const int B = 2, T = 70, C = 8, H = 2;
  auto qkv = randn(B * T * 3 * C, 7, "qkv"), R = randn(B * T * C, 7, "R");
  std::vector<float> out(B * T * C), att(B * H * T * T);
  auto loss = [&] {
    mt::nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
    return dot(out.data(), R);
  };
  loss();
  std::vector<float> dqkv(B * T * 3 * C);
  mt::nn::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, H);
  std::vector<size_t> idx;
  for (size_t i = 0; i < qkv.size(); i += 7) idx.push_back(i);
  expect_grad("dqkv", qkv, dqkv, loss, idx, 1e-2f, 5e-4, 5e-3);
  // Forward against a naive loop (causal softmax(q k^T / sqrt(hs)) v) in double.
  const int hs = C / H;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t += 13) {
        const float* q = &qkv[(b * T + t) * 3 * C + h * hs];
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; j++) {
          const float* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double d = 0;
          for (int i = 0; i < hs; i++) d += (double)q[i] * k[i];
          s[j] = d / std::sqrt((double)hs);
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= t; j++) sum += s[j] = std::exp(s[j] - mx);
        for (int i = 0; i < hs; i++) {
          double y = 0;
          for (int j = 0; j <= t; j++) y += s[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + i];
          EXPECT_NEAR(out[(b * T + t) * C + h * hs + i], y, 1e-5);
        }
        for (int j = t + 1; j < T; j++) EXPECT_EQ(att[((size_t)(b * H + h) * T + t) * T + j], 0.0f);
      }
}

TEST(LayersGradcheck, SoftmaxCrossEntropy) {
  const int N = 4, V = 11;
  auto logits = randn(N * V, 8, "logits", 2.0f);
  std::vector<int32_t> targets = {3, 0, 10, 3};
  const float dscale = 1.0f / N;
  auto loss = [&] { return mt::nn::cross_entropy_loss(logits.data(), targets.data(), N, V, nullptr) * dscale; };
  std::vector<float> work = logits, losses(N);
  double total = mt::nn::softmax_cross_entropy(work.data(), targets.data(), N, V, dscale, losses.data());
  EXPECT_NEAR(total * dscale, loss(), 1e-6);
  for (int n = 0; n < N; n++) {  // against log-sum-exp in double
    double mx = -1e300, s = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, (double)logits[n * V + j]);
    for (int j = 0; j < V; j++) s += std::exp(logits[n * V + j] - mx);
    EXPECT_NEAR(losses[n], mx + std::log(s) - logits[n * V + targets[n]], 1e-5);
  }
  expect_grad("dlogits", logits, work, loss, {}, 1e-2f, 1e-4, 1e-2);
}
