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

// n tokens (a i + b) mod vocab, i = 0 .. n-1: the inputs (7, 3) and targets (5, 1) of the gradchecks.
std::vector<int32_t> tokens(int n, int a, int b, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; i++) t[i] = (i * a + b) % vocab;
  return t;
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
  const std::vector<int32_t> in = tokens(B * T, 7, 3, cfg.vocab_size), tg = tokens(B * T, 5, 1, cfg.vocab_size);
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
  const std::vector<int32_t> in = tokens(B * T, 7, 3, cfg.vocab_size), tg = tokens(B * T, 5, 1, cfg.vocab_size);
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

namespace {

// The training loss of an MoE GPT: the cross-entropy mean plus alpha * (mean over groups of the load-
// balancing term) + beta * (mean over tokens of lse^2), summed over MoE layers, read from the layers' stats.
double moe_gpt_loss(mt::model::Gpt& gpt, mt::nn::ActivationStore& store, const std::vector<int32_t>& in,
                    const std::vector<int32_t>& tg, int B, int T, const mt::model::MoeOptions& o) {
  for (auto& m : gpt.moe_layers())
    if (m) m->stats().reset(m->experts());
  const float dscale = 1.0f / (B * T);
  double loss = gpt.forward(store, 0, in.data(), tg.data(), B, T, dscale) * dscale;
  for (auto& m : gpt.moe_layers())
    if (m) loss += o.aux_alpha * m->stats().aux_sum / (B / o.group_windows) + o.z_beta * m->stats().z_sum / (B * T);
  return loss;
}

}  // namespace

TEST(ModelGradcheck, GptMoe) {
  // 3 blocks, MoE every 2nd (block 1), 4 experts top-2 with capacity 1.0 (drops), aux and z losses on.
  mt::model::GptConfig cfg{3, 2, 16, 23, 12};
  cfg.moe_every = 2, cfg.experts = 4, cfg.moe_top_k = 2, cfg.expert_hidden = 20;
  mt::model::MoeOptions o;
  o.capacity_factor = 1.0, o.group_windows = 1, o.aux_alpha = 0.3f, o.z_beta = 0.05f, o.seed = 3;
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params, nullptr, {}, o);
  params.finalize();
  gpt.init_gpt2(5);
  for (mt::nn::Param& p : params.params()) {
    auto r = randn(p.numel, 9, p.name, p.decay ? 0.3f : 0.2f);
    for (size_t i = 0; i < p.numel; i++) p.data[i] = p.data[i] + r[i];
  }
  ASSERT_NE(params.find("h.1.mlp.experts.3.c_proj.bias"), nullptr);
  ASSERT_EQ(params.find("h.1.mlp.c_fc.weight"), nullptr);
  ASSERT_NE(params.find("h.0.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(cfg.num_params(), (int64_t)params.size());
  const int B = 2, T = 9;
  const std::vector<int32_t> in = tokens(B * T, 7, 3, cfg.vocab_size), tg = tokens(B * T, 5, 1, cfg.vocab_size);
  mt::nn::ActivationStore store;
  params.zero_grad();
  moe_gpt_loss(gpt, store, in, tg, B, T, o);
  EXPECT_GT(gpt.moe_layers()[1]->stats().dropped, 0) << "the case should drop choices";
  gpt.backward(store, 0, B, T);
  check_params(params, [&] { return moe_gpt_loss(gpt, store, in, tg, B, T, o); }, 4, 1e-4, 3e-2);
}

TEST(ModelGradcheck, GptMoeWithOneExpertIsTheDenseModel) {
  // One expert, top-1, dropless, no auxiliary losses: the gate is softmax of one logit = 1, so the block is
  // the dense MLP with the expert's weights: same loss and gradients.
  mt::model::GptConfig dense_cfg{2, 2, 16, 19, 8};
  mt::model::GptConfig moe_cfg = dense_cfg;
  moe_cfg.moe_every = 1, moe_cfg.experts = 1, moe_cfg.moe_top_k = 1;
  mt::model::MoeOptions o;
  o.capacity_factor = 0, o.aux_alpha = 0, o.z_beta = 0;
  mt::nn::ParamRegistry pd, pm;
  mt::model::Gpt dense(dense_cfg, pd), moe(moe_cfg, pm, nullptr, {}, o);
  pd.finalize();
  pm.finalize();
  dense.init_gpt2(4);
  for (mt::nn::Param& p : pm.params()) {
    std::string n = p.name;
    const size_t at = n.find("experts.0.");
    if (at != std::string::npos) n.erase(at, 10);
    if (n.find("router") != std::string::npos) {
      auto r = randn(p.numel, 1, n, 1.0f);  // any router: one expert always wins with probability 1
      std::copy(r.begin(), r.end(), p.data);
      continue;
    }
    const mt::nn::Param& q = pd.get(n);
    std::copy(q.data, q.data + q.numel, p.data);
  }
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) in[i] = tg[(i + 1) % (B * T)] = (i * 5 + 2) % 19;
  mt::nn::ActivationStore s1, s2;
  pd.zero_grad();
  pm.zero_grad();
  const double ld = dense.forward(s1, 0, in.data(), tg.data(), B, T, 1.0f / (B * T));
  const double lm = moe.forward(s2, 0, in.data(), tg.data(), B, T, 1.0f / (B * T));
  EXPECT_NEAR(lm, ld, 1e-5 * std::fabs(ld));
  dense.backward(s1, 0, B, T);
  moe.backward(s2, 0, B, T);
  for (mt::nn::Param& p : pm.params()) {
    std::string n = p.name;
    const size_t at = n.find("experts.0.");
    if (at != std::string::npos) n.erase(at, 10);
    if (n.find("router") != std::string::npos) {
      for (size_t i = 0; i < p.numel; i++) EXPECT_EQ(p.grad[i], 0.0f) << "a router with one expert has no gradient";
      continue;
    }
    const mt::nn::Param& q = pd.get(n);
    for (size_t i = 0; i < p.numel; i++) ASSERT_NEAR(p.grad[i], q.grad[i], 1e-6f + 1e-5f * std::fabs(q.grad[i])) << p.name;
  }
}

TEST(ModelGradcheck, GptMoeMicroBatchesAddUp) {
  // Routing groups are windows (G = 1), so capacity does not depend on the micro-batching: two micro-batches
  // of one window give the gradient of one batch of two, drops included.
  mt::model::GptConfig cfg{2, 2, 8, 17, 8};
  cfg.moe_every = 1, cfg.experts = 4, cfg.moe_top_k = 2;
  mt::model::MoeOptions o;
  o.capacity_factor = 1.0, o.aux_alpha = 0.1f, o.z_beta = 0.01f;
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params, nullptr, {}, o);
  params.finalize();
  gpt.init_gpt2(1);
  for (mt::nn::Param& p : params.params()) {
    auto r = randn(p.numel, 2, p.name, 0.3f);
    for (size_t i = 0; i < p.numel; i++) p.data[i] += r[i];
  }
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) in[i] = tg[(i + B * T - 1) % (B * T)] = (i * 3) % 17;
  mt::nn::ActivationStore store;
  params.zero_grad();
  double l_full = gpt.forward(store, 0, in.data(), tg.data(), B, T, 1.0f / (B * T));
  gpt.backward(store, 0, B, T);
  const int64_t dropped = gpt.moe_layers()[0]->stats().dropped + gpt.moe_layers()[1]->stats().dropped;
  EXPECT_GT(dropped, 0);
  std::vector<float> g_full(params.grad(), params.grad() + params.size());
  params.zero_grad();
  double l_mb = 0;
  for (int b = 0; b < B; b++) {
    gpt.set_moe_position(0, b);
    l_mb += gpt.forward(store, b, in.data() + b * T, tg.data() + b * T, 1, T, 1.0f / (B * T));
    gpt.backward(store, b, 1, T);
  }
  EXPECT_EQ(gpt.moe_layers()[0]->stats().dropped + gpt.moe_layers()[1]->stats().dropped, 2 * dropped);
  EXPECT_NEAR(l_full, l_mb, 1e-5);
  for (size_t i = 0; i < params.size(); i++) EXPECT_NEAR(params.grad()[i], g_full[i], 1e-6) << i;
}
