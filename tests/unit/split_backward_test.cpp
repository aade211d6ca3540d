// The split backward of model::Gpt (backward_input, then backward_weight: the zero-bubble schedules' B and W)
// against its whole backward, bit for bit: every parameter gradient and every stage's input gradient, over a
// model cut in three pipeline stages with three micro-batches, the weight halves run late and interleaved with
// the input halves (I0 I1 W0 I2 W1 W2) as a schedule runs them. Cases: float32, bf16 products, recomputation, an
// MoE block, and tensor parallelism 2 (ranks as threads) with and without sequence parallelism. The hooks show
// that a group's gradients are announced final (after_backward) only by the weight half, and that the last
// stage's own copy of the tied wte holds its final gradient once its input halves have run.
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/gpt.h"
#include "nn/activation_store.h"
#include "nn/param_hooks.h"

#include "thread_tp.h"

namespace {

using mt::testing::Group;
using mt::testing::ThreadTp;

// Counts after_backward per group.
struct CountingHooks : mt::nn::ParamHooks {
  std::vector<int> finals = std::vector<int>(16, 0);
  void after_backward(int g) override { finals.at(g)++; }
  int total() const {
    int t = 0;
    for (int f : finals) t += f;
    return t;
  }
};

struct Case {
  const char* name;
  bool bf16 = false, recompute = false, moe = false, sp = false;
  int tp = 1;
};

struct Outcome {
  std::vector<std::vector<float>> grads;    // per stage, the registry's gradient buffer
  std::vector<std::vector<float>> dinputs;  // per (stage > 0, micro-batch): the input's gradient
  int finals_in_inputs = 0, finals_total = 0;  // after_backward calls while only input halves ran; in all
  // The last stage's copy of the tied wte: its gradient once the stage's last input half has run (before W1, W2).
  std::vector<float> wte_after_inputs;
};

// One tp rank of the three-stage model over three micro-batches; split: I0 I1 W0 I2 W1 W2 per stage.
Outcome run(const Case& k, bool split, mt::nn::TensorParallelOps* tp) {
  mt::model::GptConfig cfg{4, 2, 16, 23, 12};
  mt::model::MoeOptions moe;
  if (k.moe) {
    cfg.moe_every = 2, cfg.experts = 4, cfg.moe_top_k = 2, cfg.expert_hidden = 20;
    moe.capacity_factor = 1.0, moe.aux_alpha = 0.3f, moe.z_beta = 0.05f, moe.seed = 3;
  }
  const int B = 2, T = 4, m = 3, N = B * T;
  const std::vector<mt::model::StageRange> ranges = {{0, 1, 0, 3}, {1, 3, 1, 3}, {3, 4, 2, 3}};
  std::vector<std::unique_ptr<mt::nn::ParamRegistry>> regs;
  std::vector<std::unique_ptr<mt::model::Gpt>> stages;
  std::vector<mt::nn::ActivationStore> stores(ranges.size());
  for (auto r : ranges) {
    regs.push_back(std::make_unique<mt::nn::ParamRegistry>());
    stages.push_back(std::make_unique<mt::model::Gpt>(cfg, *regs.back(), tp, r, moe));
    regs.back()->finalize();
    stages.back()->init_gpt2(5);
    stages.back()->set_recompute(k.recompute);
    stages.back()->set_sequence_parallel(k.sp);
    stages.back()->set_precision(k.bf16 ? mt::Precision::bf16 : mt::Precision::fp32);
    regs.back()->begin_grads();
  }
  const int rows = stages[0]->rows_here(N), C = cfg.n_embd;
  std::vector<std::vector<int32_t>> in(m, std::vector<int32_t>(N)), tg(m, std::vector<int32_t>(N));
  for (int i = 0; i < m; i++)
    for (int n = 0; n < N; n++) {
      in[i][n] = (n * 7 + 3 + 5 * i) % cfg.vocab_size;
      tg[i][n] = (n * 5 + 1 + 3 * i) % cfg.vocab_size;
    }
  const float dscale = 1.0f / (m * N);
  // Forward: each micro-batch through the three stages.
  for (int i = 0; i < m; i++) {
    std::vector<float> act;
    for (size_t s = 0; s < stages.size(); s++) {
      stages[s]->set_moe_position(0, i * B);
      stages[s]->forward(stores[s], i, in[i].data(), tg[i].data(), B, T, dscale, nullptr,
                         act.empty() ? nullptr : act.data());
      if (s + 1 < stages.size()) {
        const float* o = stages[s]->stage_output(stores[s], i, B, T);
        act.assign(o, o + (size_t)rows * C);
      }
    }
  }
  Outcome out;
  out.dinputs.assign(stages.size() * m, {});
  CountingHooks hooks;
  // Backward, last stage first; dout[i]: the gradient of the previous stage's output for micro-batch i.
  std::vector<std::vector<float>> dout(m);
  for (size_t s = stages.size(); s-- > 0;) {
    mt::model::Gpt& g = *stages[s];
    auto input_half = [&](int i) {
      const float* d = dout[i].empty() ? nullptr : dout[i].data();
      if (split)
        g.backward_input(stores[s], i, B, T, &hooks, d);
      else
        g.backward(stores[s], i, B, T, &hooks, d);
      if (s > 0) {
        const float* gi = g.stage_input_grad(stores[s], B, T);
        out.dinputs[s * m + i].assign(gi, gi + (size_t)rows * C);
      }
    };
    auto weight_half = [&](int i) {
      if (split) g.backward_weight(stores[s], i, B, T, &hooks);
    };
    const int before = hooks.total();
    input_half(0);
    input_half(1);
    out.finals_in_inputs += hooks.total() - before;
    weight_half(0);
    input_half(2);
    if (s + 1 == stages.size()) {
      const mt::nn::Param& w = regs[s]->get("wte.weight");
      out.wte_after_inputs.assign(w.grad, w.grad + w.numel);
    }
    weight_half(1);
    weight_half(2);
    for (int i = 0; i < m; i++) dout[i] = out.dinputs[s * m + i];
  }
  out.finals_total = hooks.total();
  for (auto& reg : regs) out.grads.emplace_back(reg->grad(), reg->grad() + reg->size());
  return out;
}

void expect_same_bits(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t s = 0; s < a.grads.size(); s++) {
    ASSERT_EQ(a.grads[s].size(), b.grads[s].size());
    EXPECT_EQ(0, std::memcmp(a.grads[s].data(), b.grads[s].data(), sizeof(float) * a.grads[s].size()))
        << what << ": stage " << s << "'s parameter gradients differ";
  }
  for (size_t k = 0; k < a.dinputs.size(); k++)
    EXPECT_TRUE(a.dinputs[k] == b.dinputs[k]) << what << ": input gradient " << k << " differs";
  // The last stage's wte copy is final after its input halves (the tie sum need not wait for its weight halves).
  ASSERT_FALSE(a.wte_after_inputs.empty());
  ASSERT_EQ(a.wte_after_inputs.size(), b.wte_after_inputs.size());
  EXPECT_EQ(0, std::memcmp(a.wte_after_inputs.data(), b.wte_after_inputs.data(),
                           sizeof(float) * a.wte_after_inputs.size()))
      << what << ": the last stage's wte gradient is not final after its input halves";
}

void check_case(const Case& k) {
  if (k.tp == 1) {
    const Outcome whole = run(k, false, nullptr), split = run(k, true, nullptr);
    expect_same_bits(whole, split, k.name);
    // No group is announced final by an input half; each group of each stage once per micro-batch in all.
    EXPECT_EQ(split.finals_in_inputs, 0) << "after_backward fired in backward_input";
    EXPECT_GT(whole.finals_in_inputs, 0);
    EXPECT_EQ(split.finals_total, whole.finals_total);
    return;
  }
  Group g1(k.tp), g2(k.tp);
  std::vector<Outcome> whole(k.tp), split(k.tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < k.tp; r++)
    threads.emplace_back([&, r] {
      ThreadTp a(g1, r), b(g2, r);
      whole[r] = run(k, false, &a);
      split[r] = run(k, true, &b);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < k.tp; r++) expect_same_bits(whole[r], split[r], std::string(k.name) + " tp rank " + std::to_string(r));
}

}  // namespace

TEST(SplitBackward, Float32) { check_case({"fp32"}); }
TEST(SplitBackward, Bf16) { check_case({"bf16", true}); }
TEST(SplitBackward, Recompute) { check_case({"recompute", false, true}); }
TEST(SplitBackward, Moe) { check_case({"moe", false, false, true}); }
TEST(SplitBackward, MoeRecompute) { check_case({"moe recompute", false, true, true}); }
TEST(SplitBackward, TensorParallel) { check_case({"tp 2", false, false, false, false, 2}); }
TEST(SplitBackward, SequenceParallel) { check_case({"tp 2 sp", false, false, false, true, 2}); }
TEST(SplitBackward, TensorParallelBf16) { check_case({"tp 2 bf16", true, false, false, false, 2}); }
