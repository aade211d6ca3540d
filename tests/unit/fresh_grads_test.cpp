// The gradient write protocol (nn/grad_out.h; ParamRegistry::begin_grads and settle_grads): after
// begin_grads a step's first write of a tensor overwrites it, later writes add, and the tensors nothing wrote
// end the group's backward at zero. Checked against the plain protocol (zero everything, then add).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <vector>

#include "model/gpt.h"
#include "model/mlp.h"
#include "nn/activation_store.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "tests/unit/gradcheck.h"

using mt::nn::GradOut;
using mt::nn::Param;
using mt::nn::ParamRegistry;

namespace {

// a[2x3] and b[4] in group 0, c[5] in group 1; every gradient 7 (what a previous step left).
void three_tensors(ParamRegistry& r) {
  r.add("a", {2, 3}, {}, 0);
  r.add("b", {4}, {}, 0);
  r.add("c", {5}, {}, 1);
  r.finalize();
  std::fill(r.grad(), r.grad() + r.size(), 7.0f);
}

}  // namespace

TEST(FreshGrads, FirstWriteOverwritesLaterWritesAddUnwrittenSettleToZero) {
  ParamRegistry r;
  r.set_check_grad_writes(false);
  three_tensors(r);
  Param &a = r.get("a"), &b = r.get("b"), &c = r.get("c");
  r.begin_grads();
  EXPECT_TRUE(a.grad_fresh && b.grad_fresh && c.grad_fresh);
  const GradOut first = a.grad_out();
  EXPECT_TRUE(first.overwrite);
  EXPECT_EQ(first.data, a.grad);
  EXPECT_EQ(first.beta(), 0.0f);
  const GradOut second = a.grad_out();
  EXPECT_FALSE(second.overwrite) << "only the step's first write overwrites";
  EXPECT_EQ(second.beta(), 1.0f);
  for (size_t i = 0; i < a.numel; i++) a.grad[i] = 1.0f + i;  // what the kernel wrote

  float* d = c.grad_acc();  // a scatter-adding writer: zeroed first
  for (size_t i = 0; i < c.numel; i++) EXPECT_EQ(d[i], 0.0f);
  d[2] = 3.0f;
  EXPECT_EQ(c.grad_acc()[2], 3.0f) << "a second adding writer must not zero again";

  r.settle_grads(0);  // b was never written: its 7s are last step's, not this step's gradient
  for (size_t i = 0; i < b.numel; i++) EXPECT_EQ(b.grad[i], 0.0f);
  for (size_t i = 0; i < a.numel; i++) EXPECT_EQ(a.grad[i], 1.0f + i) << "settling must keep what was written";
  EXPECT_FALSE(b.grad_fresh);

  // A range marks just the tensors in it (a ZeRO stage binding one bucket's fresh buffer).
  r.begin_grads(b.offset, b.numel);
  EXPECT_FALSE(a.grad_fresh);
  EXPECT_TRUE(b.grad_fresh);
  EXPECT_FALSE(c.grad_fresh);
  // zero_grad is the plain protocol: everything zero, every write adds.
  r.zero_grad();
  EXPECT_FALSE(b.grad_fresh);
  EXPECT_FALSE(a.grad_out().overwrite);
  for (size_t i = 0; i < r.size(); i++) EXPECT_EQ(r.grad()[i], 0.0f);
}

TEST(FreshGrads, GradOutFromAPlainPointerAdds) {
  float x[3] = {1, 2, 3};
  GradOut g = x;
  EXPECT_FALSE(g.overwrite);
  EXPECT_EQ(g.accumulator(3), x);
  EXPECT_EQ(x[2], 3.0f);
  GradOut none = nullptr;
  EXPECT_FALSE(none);
  EXPECT_EQ(none.accumulator(3), nullptr);
}

TEST(FreshGradsDeathTest, RangeThatCutsATensorIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the OpenMP pool of earlier tests has threads
  ParamRegistry r;
  three_tensors(r);
  EXPECT_DEATH(r.begin_grads(1, 4), "cuts tensor a");
}

TEST(FreshGradsDeathTest, CheckModeCatchesAKernelThatAddsToAnUnwrittenGradient) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the OpenMP pool of earlier tests has threads
  // It takes the GradOut (overwrite) but adds anyway: the marker NaN survives the sum.
  ParamRegistry r;
  r.set_check_grad_writes(true);
  three_tensors(r);
  r.begin_grads();
  Param& a = r.get("a");
  a.grad_out();
  for (size_t i = 0; i < a.numel; i++) a.grad[i] += 0.5f;
  EXPECT_DEATH(r.settle_grads(0), "gradient of a \\[0\\] still holds the unwritten marker");
}

TEST(FreshGradsDeathTest, CheckModeCatchesAWriteThatBypassesTheProtocol) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the OpenMP pool of earlier tests has threads
  // A write through the raw pointer leaves the tensor marked unwritten: settling would zero what it wrote.
  ParamRegistry r;
  r.set_check_grad_writes(true);
  three_tensors(r);
  r.begin_grads();
  r.get("b").grad[3] = 2.0f;
  EXPECT_DEATH(r.settle_grads(0), "b \\[3\\] was written without grad_out");
}

TEST(FreshGrads, CheckModeAcceptsTheProtocolAndADivergedNaN) {
  ParamRegistry r;
  r.set_check_grad_writes(true);
  three_tensors(r);
  r.begin_grads();
  GradOut o = r.get("a").grad_out();
  for (size_t i = 0; i < r.get("a").numel; i++) o.data[i] = i == 0 ? std::nanf("") : 1.0f;  // a NaN of its own
  r.settle_grads(0);
  r.settle_grads(1);
  EXPECT_TRUE(std::isnan(r.get("a").grad[0]));
  for (size_t i = 0; i < r.get("c").numel; i++) EXPECT_EQ(r.get("c").grad[i], 0.0f);
}

namespace {

// Runs two steps of `micro` micro-batches through `step(step, micro_batch)` twice: with the plain protocol
// (zero_grad, then every write adds) and with begin_grads over gradients full of a previous step's values,
// with and without the check. The gradients must be the same bits.
void expect_same_bits(ParamRegistry& params, const std::function<void(int, int)>& step, int micro) {
  for (int s = 0; s < 2; s++) {
    params.zero_grad();
    for (int m = 0; m < micro; m++) step(s, m);
    const std::vector<float> ref(params.grad(), params.grad() + params.size());
    for (bool check : {false, true}) {
      params.set_check_grad_writes(check);
      std::fill(params.grad(), params.grad() + params.size(), 7.0f);
      params.begin_grads();
      for (int m = 0; m < micro; m++) step(s, m);
      for (const Param& p : params.params()) {
        EXPECT_FALSE(p.grad_fresh) << p.name;
        for (size_t i = 0; i < p.numel; i++)
          ASSERT_EQ(std::bit_cast<uint32_t>(p.grad[i]), std::bit_cast<uint32_t>(ref[p.offset + i]))
              << p.name << "[" << i << "] step " << s << " check " << check << ": " << p.grad[i] << " vs "
              << ref[p.offset + i];
      }
    }
  }
}

}  // namespace

TEST(FreshGrads, GptWithUnusedExpertsAndTiedEmbeddingMatchesZeroingBitwise) {
  // Block 1 is 8 experts, top-1, dropless: 2 micro-batches of 3 tokens use 6 of them at most, so some
  // experts get no gradient at all and must end at zero, not at the 7s. wte is written by the logits'
  // product (overwrite) and then by the lookup's scatter (add); wpe by a scatter alone.
  mt::model::GptConfig cfg{2, 2, 16, 23, 8};
  cfg.moe_every = 2, cfg.experts = 8, cfg.moe_top_k = 1, cfg.expert_hidden = 12;
  mt::model::MoeOptions o;
  o.capacity_factor = 0, o.aux_alpha = 0.01f, o.seed = 1;
  ParamRegistry params;
  mt::model::Gpt gpt(cfg, params, nullptr, {}, o);
  params.finalize();
  gpt.init_gpt2(3);
  const int T = 3, M = 2;
  mt::nn::ActivationStore store;
  auto step = [&](int s, int m) {
    std::vector<int32_t> in(T), tg(T);
    for (int t = 0; t < T; t++) in[t] = tg[(t + T - 1) % T] = (t * 5 + 7 * s + 3 * m + 1) % cfg.vocab_size;
    gpt.set_moe_position(0, m);
    gpt.forward(store, m, in.data(), tg.data(), 1, T, 1.0f / (M * T));
    gpt.backward(store, m, 1, T);
  };
  expect_same_bits(params, step, M);
  int idle = 0;
  for (int e = 0; e < cfg.experts; e++) {
    const Param& w = params.get("h.1.mlp.experts." + std::to_string(e) + ".c_fc.weight");
    idle += std::all_of(w.grad, w.grad + w.numel, [](float x) { return x == 0.0f; });
  }
  EXPECT_GE(idle, 2) << "the case must leave experts without tokens";
}

TEST(FreshGrads, MlpMatchesZeroingBitwise) {
  mt::model::MlpConfig cfg{6, {5, 4}, 3};
  ParamRegistry params;
  mt::model::Mlp mlp(cfg, params);
  params.finalize();
  mlp.init(2);
  const int N = 4;
  mt::nn::ActivationStore store;
  auto step = [&](int s, int m) {
    auto x = mt::testing::randn(N * 6, 10 * s + m, "x");
    std::vector<int32_t> y = {0, 1, 2, (s + m) % 3};
    mlp.forward(store, m, x.data(), y.data(), N, 1.0f / (2 * N));
    mlp.backward(store, m, N);
  };
  expect_same_bits(params, step, 2);
}
