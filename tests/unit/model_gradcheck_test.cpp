// Whole-model finite-difference gradient checks: GPT (every tensor, a few elements each) and MLP.
#include <gtest/gtest.h>

#include "core/error.h"
#include <memory>

#include "model/gpt.h"
#include "model/mlp.h"
#include "nn/activation_store.h"
#include "tests/unit/gradcheck.h"

using mt::testing::expect_grad;
using mt::testing::randn;

namespace {

// Copies a parameter's data/grad into vectors so expect_grad can perturb it through a reference.
void check_params(mt::nn::ParamRegistry& params, const std::function<double()>& loss, int per_tensor,
                  double atol, double rtol) {
  for (mt::nn::Param& p : params.params()) {
    std::vector<float> ana(p.grad, p.grad + p.numel);
    std::vector<float> x(p.data, p.data + p.numel);
    std::vector<size_t> idx;
    for (int k = 0; k < per_tensor; k++) idx.push_back((size_t)((k * 7919 + 13) % p.numel));
    auto wrapped = [&] {
      std::copy(x.begin(), x.end(), p.data);
      return loss();
    };
    expect_grad(p.name, x, ana, wrapped, idx, 1e-2f, atol, rtol);
    std::copy(x.begin(), x.end(), p.data);
  }
}

}  // namespace

TEST(ModelGradcheck, Gpt) {
  mt::model::GptConfig cfg{2, 2, 16, 23, 12};
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params);
  params.finalize();
  gpt.init_gpt2(5);
  // Larger weights than GPT-2's 0.02 so gradients are well above float32 noise; LayerNorm params off 1/0.
  for (mt::nn::Param& p : params.params()) {
    auto r = randn(p.numel, 9, p.name, p.decay ? 0.3f : 0.2f);
    for (size_t i = 0; i < p.numel; i++) p.data[i] = p.data[i] + r[i];
  }
  const int B = 2, T = 9;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) {
    in[i] = (i * 7 + 3) % cfg.vocab_size;
    tg[i] = (i * 5 + 1) % cfg.vocab_size;
  }
  mt::nn::ActivationStore store;
  const float dscale = 1.0f / (B * T);
  auto loss = [&] { return gpt.forward(store, 0, in.data(), tg.data(), B, T, dscale) * dscale; };
  params.zero_grad();
  loss();
  gpt.backward(store, 0, B, T);
  check_params(params, loss, 4, 1e-4, 3e-2);
}

TEST(ModelGradcheck, GptMicroBatchesAddUp) {
  // Two micro-batches of 1 sequence accumulate exactly the gradient of one batch of 2 (up to rounding).
  mt::model::GptConfig cfg{1, 2, 8, 17, 8};
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params);
  params.finalize();
  gpt.init_gpt2(1);
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) in[i] = tg[(i + B * T - 1) % (B * T)] = (i * 3) % 17;
  mt::nn::ActivationStore store;
  params.zero_grad();
  double l_full = gpt.forward(store, 0, in.data(), tg.data(), B, T, 1.0f / (B * T));
  gpt.backward(store, 0, B, T);
  std::vector<float> g_full(params.grad(), params.grad() + params.size());
  params.zero_grad();
  double l_mb = 0;
  for (int b = 0; b < B; b++) {
    l_mb += gpt.forward(store, b, in.data() + b * T, tg.data() + b * T, 1, T, 1.0f / (B * T));
    gpt.backward(store, b, 1, T);
  }
  EXPECT_NEAR(l_full, l_mb, 1e-5);
  for (size_t i = 0; i < params.size(); i++) EXPECT_NEAR(params.grad()[i], g_full[i], 1e-6) << i;
}

TEST(ModelGradcheck, Mlp) {
  mt::model::MlpConfig cfg{6, {5, 4}, 3};
  mt::nn::ParamRegistry params;
  mt::model::Mlp mlp(cfg, params);
  params.finalize();
  mlp.init(2);
  for (mt::nn::Param& p : params.params()) {  // non-zero biases so they are exercised
    if (!p.decay) {
      auto r = randn(p.numel, 3, p.name, 0.3f);
      std::copy(r.begin(), r.end(), p.data);
    }
  }
  const int N = 7;
  auto x = randn(N * 6, 4, "x");
  std::vector<int32_t> y = {0, 1, 2, 1, 0, 2, 2};
  mt::nn::ActivationStore store;
  auto loss = [&] { return mlp.forward(store, 0, x.data(), y.data(), N, 1.0f / N) / N; };
  params.zero_grad();
  loss();
  mlp.backward(store, 0, N);
  check_params(params, loss, 6, 1e-4, 2e-2);
  EXPECT_EQ(cfg.num_params(), (int64_t)params.size());
}

TEST(ModelShape, GptParamCountMatchesRegistry) {
  mt::model::GptConfig cfg{3, 4, 32, 50, 20};
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params);
  EXPECT_EQ(cfg.num_params(), (int64_t)[&] {
    size_t n = 0;
    for (auto& p : params.params()) n += p.numel;
    return n;
  }());
  // GPT-2 124M has 124,439,808 parameters (wte tied, no attn.bias buffers).
  EXPECT_EQ((mt::model::GptConfig{12, 12, 768, 50257, 1024}.num_params()), 124439808);
}

TEST(ModelShape, RejectsIndivisibleHeads) {
  mt::model::GptConfig cfg{1, 3, 16, 10, 8};
  try {
    cfg.validate();
    FAIL() << "expected an InputError";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("n_embd (16) is not divisible by n_head (3)"), std::string::npos) << e.what();
  }
}

// Pipeline stages chained by hand (forward: stage output -> next stage input; backward: input gradient ->
// previous stage's dout) give the full model's loss and gradients; the tied wte's gradient is the sum of
// the first stage's (lookup) and the last stage's (logits) parts.
TEST(ModelStages, ChainedStagesEqualTheFullModel) {
  mt::model::GptConfig cfg{4, 2, 16, 23, 12};
  const int B = 2, T = 9;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) {
    in[i] = (i * 7 + 3) % cfg.vocab_size;
    tg[i] = (i * 5 + 1) % cfg.vocab_size;
  }
  const float dscale = 1.0f / (B * T);
  mt::nn::ParamRegistry full_params;
  mt::model::Gpt full(cfg, full_params);
  full_params.finalize();
  full.init_gpt2(5);
  mt::nn::ActivationStore fs;
  double full_loss = full.forward(fs, 0, in.data(), tg.data(), B, T, dscale);
  full.backward(fs, 0, B, T);

  // Three stages: blocks [0,1) with the embeddings, [1,3), [3,4) with the head.
  const std::vector<mt::model::StageRange> ranges = {{0, 1, 0, 3}, {1, 3, 1, 3}, {3, 4, 2, 3}};
  std::vector<std::unique_ptr<mt::nn::ParamRegistry>> regs;
  std::vector<std::unique_ptr<mt::model::Gpt>> stages;
  std::vector<mt::nn::ActivationStore> stores(ranges.size());
  for (auto r : ranges) {
    regs.push_back(std::make_unique<mt::nn::ParamRegistry>());
    stages.push_back(std::make_unique<mt::model::Gpt>(cfg, *regs.back(), nullptr, r));
    regs.back()->finalize();
    stages.back()->init_gpt2(5);  // counter-based: every stage draws the same values as the full model
  }
  EXPECT_TRUE(stages[0]->first_stage() && !stages[0]->last_stage());
  EXPECT_TRUE(!stages[2]->first_stage() && stages[2]->last_stage());
  const float* act = nullptr;
  double loss = 0;
  for (size_t k = 0; k < stages.size(); k++) {
    loss = stages[k]->forward(stores[k], 0, k == 0 ? in.data() : nullptr, tg.data(), B, T, dscale, nullptr, act);
    if (k + 1 < stages.size()) act = stages[k]->stage_output(stores[k], 0, B, T);
  }
  EXPECT_NEAR(loss, full_loss, 1e-9 * std::abs(full_loss));
  std::vector<float> dout;
  for (size_t k = stages.size(); k-- > 0;) {
    stages[k]->backward(stores[k], 0, B, T, nullptr, dout.empty() ? nullptr : dout.data());
    if (k > 0) {
      const float* g = stages[k]->stage_input_grad(stores[k], B, T);
      dout.assign(g, g + (size_t)B * T * cfg.n_embd);
    }
  }
  for (const mt::nn::Param& p : full_params.params()) {
    std::vector<double> got(p.numel, 0.0);
    int holders = 0;
    for (auto& reg : regs) {
      mt::nn::Param* q = reg->find(p.name);
      if (!q) continue;
      holders++;
      for (size_t i = 0; i < p.numel; i++) got[i] += q->grad[i];
    }
    EXPECT_EQ(holders, p.name == "wte.weight" ? 2 : 1) << p.name;
    double worst = 0;
    for (size_t i = 0; i < p.numel; i++) worst = std::max(worst, std::abs(got[i] - p.grad[i]));
    EXPECT_LE(worst, 1e-6) << p.name;
  }
}
