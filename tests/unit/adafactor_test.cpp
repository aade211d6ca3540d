// Adafactor (optim/adafactor.h) against the formulas written out in double: beta2_t, the factored
// moments reproducing a rank-1 squared gradient at step 1, the vector case, the update clipping by RMS,
// pieces that cut a matrix through its rows, and the state's names and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "optim/adafactor.h"
#include "stat_phase.h"

namespace {

using mt::optim::Adafactor;
using mt::optim::kAdafactorEps1;

const float* state_of(Adafactor& opt, const std::string& name) {
  for (size_t k = 0; k < opt.state().count(); k++)
    if (opt.state().at(k).name == name) return opt.state().data(k);
  ADD_FAILURE() << "no state buffer " << name;
  return nullptr;
}

TEST(Adafactor, Beta2Schedule) {
  EXPECT_EQ(Adafactor::beta2_at(0), 0.0);
  EXPECT_DOUBLE_EQ(Adafactor::beta2_at(1), 1.0 - std::pow(2.0, -0.8));
  EXPECT_DOUBLE_EQ(Adafactor::beta2_at(9), 1.0 - std::pow(10.0, -0.8));
}

TEST(Adafactor, StateIsFactoredPerMatrix) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {3, 4});
  reg.add("b", {5});
  reg.finalize();
  Adafactor opt(reg.size(), reg, {});
  ASSERT_EQ(opt.state().count(), 3u);
  EXPECT_EQ(opt.state().at(0).name, "adafactor.v");
  EXPECT_EQ(opt.state().at(0).shape, std::vector<int64_t>({17}));
  EXPECT_EQ(opt.state().at(1).name, "adafactor.row/w");
  EXPECT_EQ(opt.state().at(1).shape, std::vector<int64_t>({3}));
  EXPECT_EQ(opt.state().at(2).name, "adafactor.col/w");
  EXPECT_EQ(opt.state().at(2).shape, std::vector<int64_t>({4}));
  EXPECT_EQ(opt.state().factored(), std::vector<size_t>({1, 2}));
}

TEST(Adafactor, RefusesTensorsOfMoreThanTwoDims) {
  mt::nn::ParamRegistry reg;
  reg.add("cube", {2, 2, 2});
  reg.finalize();
  try {
    Adafactor opt(reg.size(), reg, {});
    FAIL() << "a 3-dim tensor was accepted";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cube"), std::string::npos) << e.what();
  }
}

// g = outer(a, b) with a zero row: at step 1 (beta2 = 0) V = outer(R, C) / mean(R) is g^2 to within a few eps1
// (the zero row's V is eps1-sized, not 0), so U = sign(g) (0 on the zero row), RMS(U) < 1, no clipping.
TEST(Adafactor, RankOneSquaredGradientAtStepOne) {
  const float a[3] = {1.0f, 0.0f, 2.0f}, b[4] = {2.0f, 1.0f, 4.0f, 0.5f};
  mt::nn::ParamRegistry reg;
  reg.add("w", {3, 4});
  reg.finalize();
  float* p = reg.data();
  float* g = reg.grad();
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) g[i * 4 + j] = a[i] * b[j], p[i * 4 + j] = 0.25f * (float)(i - j);
  std::vector<float> p0(p, p + 12);
  Adafactor opt(12, reg, {0.5f});
  mt::test::step_with_stats(opt, reg, mt::optim::segments_of(reg), p, g, 0.125f, 0);
  const float* R = state_of(opt, "adafactor.row/w");
  const float* C = state_of(opt, "adafactor.col/w");
  ASSERT_TRUE(R && C);
  const double mean_r = ((double)R[0] + R[1] + R[2]) / 3;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) {
      const double V = (double)R[i] * C[j] / mean_r, g2 = (double)g[i * 4 + j] * g[i * 4 + j];
      EXPECT_NEAR(V, g2, 4 * kAdafactorEps1 + 2e-7 * g2) << "V[" << i << "," << j << "]";
      const double U = g[i * 4 + j] == 0 ? 0.0 : std::copysign(1.0, g[i * 4 + j]);
      EXPECT_NEAR(p[i * 4 + j], p0[i * 4 + j] - 0.125 * (U + 0.5 * p0[i * 4 + j]), 2e-7) << "w[" << i << "," << j << "]";
    }
  EXPECT_GT(R[1], 0.0f) << "the zero row's moment is eps1, not 0";
}

// eps1 is 1e-16: a gradient entry of 1e-8 (g^2 = eps1) gets V = 2e-16 at step 1 and U = 1/sqrt(2), not the
// sign step of 1 that the paper's 1e-30 would give; a zero entry gets U = 0.
TEST(Adafactor, Eps1IsOneE16) {
  EXPECT_EQ(kAdafactorEps1, 1e-16);
  mt::nn::ParamRegistry reg;
  reg.add("b", {2});
  reg.finalize();
  reg.grad()[0] = 1e-8f;
  Adafactor opt(2, reg, {});
  mt::test::step_with_stats(opt, reg, mt::optim::segments_of(reg), reg.data(), reg.grad(), 0.5f, 0);
  const double u = (double)1e-8f / std::sqrt((double)1e-8f * 1e-8f + 1e-16);
  EXPECT_NEAR(reg.data()[0], -0.5 * u, 1e-7);
  EXPECT_NEAR(reg.data()[0], -0.5 / std::sqrt(2.0), 1e-6);
  EXPECT_EQ(reg.data()[1], 0.0f);
}

// A vector over three steps against the formula in double; the third step's gradient is 8x the others, so
// U's RMS exceeds 1 there (asserted) and the update is scaled down by it. No decay on a vector.
TEST(Adafactor, VectorCaseWithRmsClipping) {
  mt::nn::ParamRegistry reg;
  reg.add("b", {5});
  reg.finalize();
  float* p = reg.data();
  float* g = reg.grad();
  for (int i = 0; i < 5; i++) p[i] = 0.1f * (float)i;
  std::vector<double> pd(p, p + 5), V(5, 0);
  Adafactor opt(5, reg, {0.5f});
  bool clipped = false;
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < 5; i++) g[i] = (s == 2 ? 8.0f : 1.0f) * 0.01f * (float)(i - 2 + s);
    const float lr = 0.05f;
    mt::test::step_with_stats(opt, reg, mt::optim::segments_of(reg), p, g, lr, s);
    const double b2 = 1.0 - std::pow(s + 1.0, -0.8);
    std::vector<double> U(5);
    double uu = 0;
    for (int i = 0; i < 5; i++) {
      V[i] = b2 * V[i] + (1 - b2) * ((double)g[i] * g[i] + kAdafactorEps1);
      U[i] = g[i] / std::sqrt(V[i]);
      uu += U[i] * U[i];
    }
    const double rms = std::sqrt(uu / 5);
    clipped |= rms > 1.01;
    for (int i = 0; i < 5; i++) {
      pd[i] -= lr * U[i] / std::max(1.0, rms);
      EXPECT_NEAR(p[i], pd[i], 1e-6) << "step " << s << " element " << i;
    }
  }
  EXPECT_TRUE(clipped) << "test setup: RMS(U) never exceeded 1";
}

// A [4, 6] matrix cut into pieces across rows (as ZeRO cuts it), four steps with a clipping scale on one,
// against the formulas in double over the whole tensor, beside a [6] vector.
TEST(Adafactor, MatrixPiecesMatchWholeTensorFormulaOverSteps) {
  const int rows = 4, cols = 6;
  mt::nn::ParamRegistry reg;
  reg.add("w", {rows, cols});
  reg.add("b", {cols});
  reg.finalize();
  const size_t n = reg.size();
  float* p = reg.data();
  float* g = reg.grad();
  for (size_t i = 0; i < n; i++) p[i] = 0.05f * (float)((int)(i * 5 % 9) - 4);
  std::vector<double> pd(p, p + n), R(rows, 0), C(cols, 0), Vb(cols, 0);
  Adafactor opt(n, reg, {0.1f});
  const auto segs = mt::test::cut_pieces(reg, {{5, 13, 14}, {4}});
  bool clipped = false;
  for (int s = 0; s < 4; s++) {
    for (size_t i = 0; i < n; i++) g[i] = 0.02f * (float)((int)((i * 7 + 3 * s) % 11) - 5) * (s == 3 ? 6.0f : 1.0f);
    const float scale = s == 1 ? 0.75f : 1.0f;
    if (s == 1) opt.scale_next_grads(scale);
    const float lr = 0.02f;
    mt::test::step_with_stats(opt, reg, segs, p, g, lr, s);
    const double b2 = 1.0 - std::pow(s + 1.0, -0.8);
    auto gs = [&](size_t i) { return (double)(float)(g[i] * scale); };
    // matrix
    std::vector<double> rs(rows, 0), cs(cols, 0);
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) rs[i] += gs(i * cols + j) * gs(i * cols + j), cs[j] += gs(i * cols + j) * gs(i * cols + j);
    double mean_r = 0;
    for (int i = 0; i < rows; i++) R[i] = b2 * R[i] + (1 - b2) * (rs[i] / cols + kAdafactorEps1), mean_r += R[i] / rows;
    for (int j = 0; j < cols; j++) C[j] = b2 * C[j] + (1 - b2) * (cs[j] / rows + kAdafactorEps1);
    std::vector<double> U(rows * cols);
    double uu = 0;
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) U[i * cols + j] = gs(i * cols + j) / std::sqrt(R[i] * C[j] / mean_r), uu += U[i * cols + j] * U[i * cols + j];
    const double rms = std::sqrt(uu / (rows * cols));
    clipped |= rms > 1.01;
    for (int k = 0; k < rows * cols; k++) {
      pd[k] -= lr * (U[k] / std::max(1.0, rms) + 0.1 * pd[k]);
      EXPECT_NEAR(p[k], pd[k], 2e-6) << "step " << s << " w[" << k << "]";
    }
    // vector
    double ub = 0;
    std::vector<double> u(cols);
    for (int j = 0; j < cols; j++) {
      const size_t i = rows * cols + j;
      Vb[j] = b2 * Vb[j] + (1 - b2) * (gs(i) * gs(i) + kAdafactorEps1);
      u[j] = gs(i) / std::sqrt(Vb[j]);
      ub += u[j] * u[j];
    }
    const double rb = std::max(1.0, std::sqrt(ub / cols));
    for (int j = 0; j < cols; j++) {
      pd[rows * cols + j] -= lr * u[j] / rb;
      EXPECT_NEAR(p[rows * cols + j], pd[rows * cols + j], 2e-6) << "step " << s << " b[" << j << "]";
    }
  }
  EXPECT_TRUE(clipped) << "test setup: RMS(U) of the matrix never exceeded 1";
}

}  // namespace

namespace {

TEST(Adafactor, FusedClipScaleEqualsPrescaledGradients) {
  mt::nn::ParamRegistry reg;
  reg.add("w", {7, 9});
  reg.add("b", {9});
  reg.finalize();
  EXPECT_EQ(mt::test::fused_scale_mismatch(reg, [&] { return std::make_unique<Adafactor>(reg.size(), reg, mt::optim::AdafactorConfig{0.1f}); }), -1)
      << "(index >= n: the step after)";
}

}  // namespace
