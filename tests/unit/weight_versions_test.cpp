// The delay-1 rule's weight versions (train/weight_versions.h), alone and inside the parameter store under
// each ZeRO stage (one rank): what the model reads in step t is W(t-1), what the optimizer updates is W(t),
// and what is left between steps (the master, and the other version a checkpoint keeps). The reference is the
// rule written out on plain floats: g_t = f(W(t-1)), W(t+1) = W(t) - lr g_t, with f nonlinear so that reading
// W(t) or W(t-2) instead gives other numbers (checked here, so the comparison can fail).
#include "train/weight_versions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "train/train_config.h"

namespace {

using mt::train::DelayOneVersions;

float f(float x) { return x * x - 0.5f * x + 0.25f; }  // the "gradient" at weight x

// The rule with delay d on plain floats: g_t = f(W(t-d)) (W(negative) = W(0)), W(t+1) = W(t) - lr g_t.
std::vector<float> rule(std::vector<float> w, int steps, int d, float lr) {
  std::vector<std::vector<float>> hist{w};  // hist[t] = W(t)
  for (int t = 0; t < steps; t++) {
    const std::vector<float>& read = hist[(size_t)std::max(0, t - d)];
    for (size_t i = 0; i < w.size(); i++) w[i] -= lr * f(read[i]);
    hist.push_back(w);
  }
  return w;
}

std::vector<float> start(size_t n) {
  std::vector<float> w(n);
  for (size_t i = 0; i < n; i++) w[i] = -0.9f + 0.13f * (float)i;
  return w;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The table of weight_versions.h, buffer by buffer.
TEST(WeightVersions, ForwardReadsThePreviousVersionAndTheUpdateTheMaster) {
  const size_t n = 5;
  const float lr = 0.1f;
  std::vector<float> a = start(n);
  DelayOneVersions v;
  v.bind(a.data(), n);
  EXPECT_EQ(std::vector<float>(v.other(), v.other() + n), a) << "W(-1) = W(0)";
  EXPECT_EQ(v.bytes(), n * sizeof(float));
  std::vector<std::vector<float>> hist{a};  // W(0), W(1), ...
  for (int t = 0; t < 6; t++) {
    v.before_forward();
    EXPECT_EQ(a, hist[(size_t)std::max(0, t - 1)]) << "step " << t << " reads W(t-1)";
    const std::vector<float> read = a;
    v.before_update();
    EXPECT_EQ(a, hist[(size_t)t]) << "step " << t << " updates W(t)";
    for (size_t i = 0; i < n; i++) a[i] -= lr * f(read[i]);
    hist.push_back(a);
    EXPECT_EQ(std::vector<float>(v.other(), v.other() + n), hist[(size_t)t]) << "after step " << t << ": W(t) kept";
  }
  EXPECT_EQ(a, rule(start(n), 6, 1, lr));
}

// The store calls the part where the step reads and updates, for every ZeRO stage: a step is the hooks'
// sequence of the micro-batch loop (one micro-batch, one group), the gradient f(weights read) written through
// the gradient the stage binds, then the update with SGD (no momentum).
TEST(WeightVersions, TheStoreAppliesTheRuleUnderEveryZeroStage) {
  const size_t n = 7;
  const int steps = 6;
  const float lr = 0.1f;
  const std::vector<float> want = rule(start(n), steps, 1, lr);
  // The comparison can fail: the rule with delay 0 or 2 lands far from delay 1.
  ASSERT_GT(max_diff(rule(start(n), steps, 0, lr), want), 1e-3f);
  ASSERT_GT(max_diff(rule(start(n), steps, 2, lr), want), 1e-3f);
  for (int zero = 0; zero <= 3; zero++) {
    mt::nn::ParamRegistry reg;
    reg.add("w", {(int64_t)n});
    mt::parallel::DataParallelOptions o;
    o.zero = zero;
    mt::parallel::DataParallel store(reg, nullptr, o);
    const std::vector<float> w0 = start(n);
    store.initialize([&](mt::nn::Param& p) { std::copy(w0.begin(), w0.end(), p.data); });
    store.set_versions(std::make_unique<DelayOneVersions>());
    EXPECT_EQ(store.param_bytes(), 2 * n * sizeof(float)) << "ZeRO " << zero << ": two versions";
    mt::optim::Sgd opt(store.state_size(), {0.0f, 0.0f});
    std::vector<float> prev = w0, master = w0;
    for (int s = 0; s < steps; s++) {
      store.begin_step();
      store.begin_micro_batch(0, 1);
      mt::nn::Param& p = reg.get("w");
      store.before_forward(0);
      const std::vector<float> read(p.data, p.data + n);
      EXPECT_EQ(read, prev) << "ZeRO " << zero << " step " << s << ": forward reads W(t-1)";
      store.after_forward(0);
      store.before_backward(0);
      float* g = p.grad_acc();
      for (size_t i = 0; i < n; i++) g[i] += f(p.data[i]);
      store.after_backward(0);
      store.finish_backward();
      store.update(opt, lr, s);
      prev = master;
      store.full_params(master);
      std::vector<float> other;
      store.full_other_params(other);
      EXPECT_EQ(other, prev) << "ZeRO " << zero << " after step " << s << ": the other version is W(t)";
    }
    EXPECT_LE(max_diff(master, want), 1e-6f) << "ZeRO " << zero;
    // A resume: both versions loaded into a fresh store continue the same run.
    std::vector<float> other;
    store.full_other_params(other);
    mt::nn::ParamRegistry reg2;
    reg2.add("w", {(int64_t)n});
    mt::parallel::DataParallel again(reg2, nullptr, o);
    again.initialize([&](mt::nn::Param& p) { std::fill(p.data, p.data + n, 0.0f); });
    again.set_versions(std::make_unique<DelayOneVersions>());
    again.load_full_params(master.data());
    again.load_full_other_params(other.data());
    again.begin_step();
    again.begin_micro_batch(0, 1);
    again.before_forward(0);
    EXPECT_EQ(std::vector<float>(reg2.get("w").data, reg2.get("w").data + n), other) << "ZeRO " << zero;
    again.after_forward(0);
  }
}

TEST(WeightVersions, WhichRunsFollowTheRule) {
  mt::train::TrainConfig c;
  EXPECT_FALSE(mt::train::delay_one(c));
  EXPECT_EQ(mt::train::make_weight_versions(c), nullptr);
  c.delayed_update = true;
  EXPECT_TRUE(mt::train::delay_one(c));
  EXPECT_NE(mt::train::make_weight_versions(c), nullptr);
  c.delayed_update = false;
  c.pp = 2;
  EXPECT_FALSE(mt::train::delay_one(c)) << "1f1b by default";
  c.schedule = "pipedream-2bw";
  EXPECT_TRUE(mt::train::delay_one(c));
  c.schedule = "1f1b";
  EXPECT_FALSE(mt::train::delay_one(c));
}

}  // namespace
