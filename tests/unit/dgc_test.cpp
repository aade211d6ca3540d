// Deep Gradient Compression (parallel/compress/dgc.h) through the exchange on one rank: the corrected momentum
// against values worked out by hand from the rule (u = m u + g, v += u, top-k of v, u and v zeroed where sent),
// the sparsity warm-up's densities, local clipping at thr / sqrt(N), m = 0 (the AdamW case) equal to plain top-k
// with error feedback, and the refused flag combinations naming both flags.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/params.h"
#include "parallel/compress/dgc.h"
#include "parallel/compress/exchange.h"
#include "train/train_config.h"

namespace {

using mt::compress::AdaptiveOptions;
using mt::compress::CompressSpec;
using mt::compress::DgcOptions;
using mt::compress::GradientExchange;
using mt::compress::Method;

CompressSpec topk(double ratio) {
  CompressSpec s;
  s.method = Method::topk;
  s.ratio = ratio;
  return s;
}

void set_grad(mt::nn::ParamRegistry& p, const std::vector<float>& g) {
  ASSERT_EQ(g.size(), p.size());
  std::memcpy(p.grad(), g.data(), sizeof(float) * g.size());
}

std::vector<float> grad_of(mt::nn::ParamRegistry& p) { return {p.grad(), p.grad() + p.size()}; }

// One tensor of 4, k = 1 (topk:0.25), m = 0.5, no clipping, no warm-up. Worked by hand (all values exact in
// float32):
//   s  g                  u = m u + g              v = v + u                 sent      u, v after masking
//   0  [1, 2, -3, .5]     [1, 2, -3, .5]           [1, 2, -3, .5]            2: -3     [1,2,0,.5]  [1,2,0,.5]
//   1  [1, 1, 1, 1]       [1.5, 2, 1, 1.25]        [2.5, 4, 1, 1.75]         1: 4      [1.5,0,1,1.25]  [2.5,0,1,1.75]
//   2  [0, 0, 2, -4]      [.75, 0, 2.5, -3.375]    [3.25, 0, 3.5, -1.625]    2: 3.5    [.75,0,0,-3.375] [3.25,0,0,-1.625]
//   3  [1, 0, 0, -1]      [1.375, 0, 0, -2.6875]   [4.625, 0, 0, -4.3125]    0: 4.625
// Without momentum factor masking (u kept where sent) step 2 would send entry 0 (3.25), not entry 2.
TEST(Dgc, CorrectedMomentumMatchesTheHandWorkedSteps) {
  mt::nn::ParamRegistry p;
  p.add("w", {4}, {}, 0);
  p.finalize();
  DgcOptions dgc{true, 0.5f, 0.0, 0};
  GradientExchange ex(p, nullptr, topk(0.25), AdaptiveOptions{}, 1, nullptr, dgc);
  const std::vector<std::vector<float>> g = {{1, 2, -3, 0.5f}, {1, 1, 1, 1}, {0, 0, 2, -4}, {1, 0, 0, -1}};
  const std::vector<std::vector<float>> sent = {{0, 0, -3, 0}, {0, 4, 0, 0}, {0, 0, 3.5f, 0}, {4.625f, 0, 0, 0}};
  const std::vector<std::vector<float>> u_after = {
      {1, 2, 0, 0.5f}, {1.5f, 0, 1, 1.25f}, {0.75f, 0, 0, -3.375f}, {0, 0, 0, -2.6875f}};
  for (int s = 0; s < 4; s++) {
    set_grad(p, g[s]);
    ex.exchange(s);
    EXPECT_EQ(grad_of(p), sent[s]) << "step " << s;
    EXPECT_EQ(ex.momentum().velocity(0), u_after[s]) << "step " << s;
    EXPECT_EQ(ex.density(), 0.25);
    EXPECT_EQ(ex.clip_factor(), 1.0f);
  }
}

// With m = 0 (DGC under AdamW) the velocity is the clipped gradient and v is top-k's error-feedback residual:
// the exchanged gradients equal plain topk with error feedback, bit for bit, on random gradients.
TEST(Dgc, ZeroMomentumIsTopkWithErrorFeedback) {
  auto build = [](mt::nn::ParamRegistry& p) {
    p.add("a", {8, 16}, {}, 0);
    p.add("b", {16}, {}, 1);
    p.finalize();
  };
  mt::nn::ParamRegistry p1, p2;
  build(p1);
  build(p2);
  GradientExchange dgc(p1, nullptr, topk(0.05), AdaptiveOptions{}, 1, nullptr, DgcOptions{true, 0.0f, 0.0, 0});
  GradientExchange plain(p2, nullptr, topk(0.05), AdaptiveOptions{}, 1);
  for (int s = 0; s < 6; s++) {
    const mt::CounterRng rng(5, "dgc-test/" + std::to_string(s));
    std::vector<float> g(p1.size());
    for (size_t i = 0; i < g.size(); i++) g[i] = (float)rng.normal(i);
    set_grad(p1, g);
    set_grad(p2, g);
    dgc.exchange(s);
    plain.exchange(s);
    EXPECT_EQ(grad_of(p1), grad_of(p2)) << "step " << s;
  }
}

// Warm-up W = 8 in four stages of two steps: 25%, 6.25%, 1.5625%, 0.390625%, never below the target, then the
// target; W = 0: the target from the start. The exchange sends that many entries.
TEST(Dgc, SparsityWarmupStages) {
  const double want[] = {0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.00390625, 0.00390625, 0.001, 0.001};
  for (int s = 0; s < 10; s++) EXPECT_EQ(mt::compress::dgc_density(0.001, 8, s), want[s]) << "step " << s;
  EXPECT_EQ(mt::compress::dgc_density(0.1, 8, 4), 0.1);  // the target is the floor
  EXPECT_EQ(mt::compress::dgc_density(0.001, 0, 0), 0.001);
  EXPECT_EQ(mt::compress::dgc_density(0.001, 3, 2), 0.015625);  // stage floor(4 * 2 / 3) = 2

  mt::nn::ParamRegistry p;
  p.add("w", {64}, {}, 0);
  p.finalize();
  GradientExchange ex(p, nullptr, topk(1.0 / 64), AdaptiveOptions{}, 1, nullptr, DgcOptions{true, 0.9f, 0.0, 8});
  const size_t kept[] = {16, 16, 4, 4, 1, 1, 1, 1, 1};  // ceil(64 x density), at least the target's 1
  for (int s = 0; s < 9; s++) {
    std::vector<float> g(64);
    for (size_t i = 0; i < g.size(); i++) g[i] = (float)(i + 1);  // all nonzero: every kept entry shows
    set_grad(p, g);
    ex.exchange(s);
    size_t nonzero = 0;
    for (float x : grad_of(p)) nonzero += x != 0.0f;
    EXPECT_EQ(nonzero, kept[s]) << "step " << s;
  }
}

// Local clipping: the share is scaled by min(1, thr / sqrt(N) / (|g| + 1e-6)) before it enters the velocity.
TEST(Dgc, LocalClippingAtThresholdOverRootN) {
  EXPECT_FLOAT_EQ(mt::compress::dgc_clip_factor(2.0, 2.0, 4), (float)(1.0 / (2.0 + 1e-6)));  // local thr 1
  EXPECT_EQ(mt::compress::dgc_clip_factor(0.5, 2.0, 4), 1.0f);                               // below: untouched
  EXPECT_EQ(mt::compress::dgc_clip_factor(100.0, 0.0, 4), 1.0f);                             // off

  mt::nn::ParamRegistry p;
  p.add("w", {2}, {}, 0);
  p.finalize();
  GradientExchange ex(p, nullptr, topk(1.0), AdaptiveOptions{}, 1, nullptr, DgcOptions{true, 0.0f, 1.0, 0});
  set_grad(p, {3, 4});  // norm 5, one rank: thr 1
  ex.exchange(0);
  const float f = (float)(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(ex.clip_factor(), f);
  EXPECT_EQ(grad_of(p), (std::vector<float>{3 * f, 4 * f}));
}

std::string error_of(const mt::train::TrainConfig& c, int world) {
  try {
    c.validate(world);
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Dgc, RefusedCombinationsNameBothFlags) {
  mt::train::TrainConfig c;
  c.data = "unused.bin";
  c.nproc = 2;
  c.dgc = true;
  EXPECT_NE(error_of(c, 2).find("--dgc with no --compress"), std::string::npos) << error_of(c, 2);
  c.compress = mt::compress::parse_compress_spec("qsgd:4");
  EXPECT_NE(error_of(c, 2).find("--dgc with --compress qsgd:4"), std::string::npos) << error_of(c, 2);
  c.compress = mt::compress::parse_compress_spec("topk:0.001");
  EXPECT_EQ(error_of(c, 2), "(no error)");
  c.compress_adaptive = true;
  EXPECT_NE(error_of(c, 2).find("--dgc with --compress-adaptive"), std::string::npos) << error_of(c, 2);
  c.compress_adaptive = false;
  c.dgc = false;
  c.dgc_warmup = 10;
  EXPECT_NE(error_of(c, 2).find("--dgc-warmup-steps needs --dgc"), std::string::npos) << error_of(c, 2);
}

}  // namespace

namespace {

TEST(OnebitAdamFlags, RefusedWithOffloadAndTheDelayOneRuleNamingBothFlags) {
  mt::train::TrainConfig c;
  c.data = "unused.bin";
  c.nproc = 2;
  c.optimizer = mt::train::OptimizerKind::onebit_adam;
  c.freeze_step = 2;
  EXPECT_EQ(error_of(c, 2), "(no error)");
  c.offload.optimizer = true;
  c.offload.dir = "/tmp";
  EXPECT_NE(error_of(c, 2).find("--optimizer onebit-adam with --offload optimizer"), std::string::npos)
      << error_of(c, 2);
  c.offload = {};
  c.delayed_update = true;
  EXPECT_NE(error_of(c, 2).find("--optimizer onebit-adam with --delayed-update"), std::string::npos)
      << error_of(c, 2);
}

}  // namespace
