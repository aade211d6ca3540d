// The bf16 mirror of the weights (nn::ParamRegistry::enable_mirror, kept by the parameter store,
// parallel/data): products read weights rounded once per step after the update instead of rounding them per
// product, which is the same rounding, so training with the mirror must give the bits of training without it,
// step after step. A mirror that is not remade after an update (or after loading) is what this catches: step 2
// would multiply by step 1's weights. One process (no data-parallel group), ZeRO 0-3 (stage 3 gathers the
// mirror from its bf16 shard), a dense and an MoE GPT, on the native and the emulated bf16 path.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "model/gpt.h"
#include "nn/activation_store.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"

namespace {

constexpr int B = 4, T = 8;

struct Trajectory {
  std::vector<double> loss, norm;
  std::vector<float> params;  // after the last step
};

// Wraps the store's hooks and checks, whenever a group is in use, what the products are given: with the mirror,
// a weight products alone read has its bf16 mirror (and, under ZeRO 3, no float32 copy: it was gathered in bf16
// alone), every other tensor its float32 values.
class MirrorCheck : public mt::nn::ParamHooks {
 public:
  MirrorCheck(mt::parallel::DataParallel& dp, mt::nn::ParamRegistry& params, bool mirror, int zero)
      : dp_(dp), params_(params), mirror_(mirror), zero_(zero) {}
  void before_forward(int g) override {
    dp_.before_forward(g);
    check(g);
  }
  void after_forward(int g) override { dp_.after_forward(g); }
  void before_backward(int g) override {
    dp_.before_backward(g);
    check(g);
  }
  void after_backward(int g) override { dp_.after_backward(g); }
  int product_only = 0;  // checks of a weight products alone read

 private:
  void check(int g) {
    for (const mt::nn::Param& p : params_.params()) {
      if (p.group != g) continue;
      if (p.read_f32) { EXPECT_NE(p.data, nullptr) << p.name; }
      if (!p.products) { EXPECT_EQ(p.data16, nullptr) << p.name; }
      if (!mirror_) { EXPECT_EQ(p.data16, nullptr) << p.name; }
      if (!p.products || p.read_f32 || !mirror_) continue;
      product_only++;
      EXPECT_NE(p.data16, nullptr) << p.name;
      if (zero_ == 3) { EXPECT_EQ(p.data, nullptr) << p.name; }
    }
  }
  mt::parallel::DataParallel& dp_;
  mt::nn::ParamRegistry& params_;
  bool mirror_;
  int zero_;
};

// `steps` AdamW steps of the GPT under --precision bf16 with the store's mirror on or off. A large learning
// rate, so that every step moves many weights across bf16 rounding boundaries: a stale mirror changes step 2.
Trajectory train(const mt::model::GptConfig& cfg, int zero, bool mirror, int steps, bool reload = false) {
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params);
  gpt.set_precision(mt::Precision::bf16);
  mt::parallel::DataParallelOptions o;
  o.zero = zero;
  o.bucket_mb = 0.004;  // MB: several buckets
  o.bf16_mirror = mirror;
  mt::parallel::DataParallel dp(params, nullptr, o);
  dp.initialize([&](mt::nn::Param& p) { gpt.init_param(p, 5); });
  mt::optim::AdamW opt(dp.state_size(), {0.9f, 0.95f, 1e-8f, 0.1f});
  mt::nn::ActivationStore store;
  MirrorCheck hooks(dp, params, mirror, zero);
  Trajectory t;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int s = 0; s < steps; s++) {
    if (reload && s == steps - 1) {  // the last step from reloaded parameters (a resume)
      std::vector<float> full;
      dp.full_params(full);
      for (float& v : full) v *= 1.01f;
      dp.load_full_params(full.data());
    }
    for (int i = 0; i < B * T; i++) {
      in[i] = (i * 7 + 3 * s + 1) % cfg.vocab_size;
      tg[i] = (i * 11 + 5 * s + 2) % cfg.vocab_size;
    }
    dp.begin_step();
    dp.begin_micro_batch(0, 1);
    t.loss.push_back(gpt.forward(store, 0, in.data(), tg.data(), B, T, 1.0f / (B * T), &hooks));
    gpt.backward(store, 0, B, T, &hooks);
    dp.finish_backward();
    t.norm.push_back(dp.grad_norm());
    dp.update(opt, 3e-2f, s);
  }
  dp.full_params(t.params);
  if (mirror) { EXPECT_GT(hooks.product_only, 0); }
  return t;
}

void expect_same_bits(const Trajectory& a, const Trajectory& b) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t s = 0; s < a.loss.size(); s++) {
    EXPECT_EQ(0, std::memcmp(&a.loss[s], &b.loss[s], sizeof(double))) << "step " << s + 1 << " loss " << a.loss[s]
                                                                      << " vs " << b.loss[s];
    EXPECT_EQ(0, std::memcmp(&a.norm[s], &b.norm[s], sizeof(double))) << "step " << s + 1 << " norm " << a.norm[s]
                                                                      << " vs " << b.norm[s];
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), sizeof(float) * a.params.size()));
}

class Bf16Mirror : public ::testing::TestWithParam<int> {  // 0: emulated, 1: native
 protected:
  void SetUp() override {
    mt::set_bf16_emulation(GetParam() == 0);
    if (GetParam() == 1 && !mt::bf16_native()) GTEST_SKIP() << "no bf16 instructions here: " << mt::gemm_kernel_line();
  }
  void TearDown() override { mt::set_bf16_emulation(std::nullopt); }
};

const mt::model::GptConfig kDense{2, 2, 16, 29, 8};
const mt::model::GptConfig kMoe{2, 2, 16, 29, 8, /*moe_every*/ 2, /*experts*/ 4, /*top_k*/ 2};

TEST_P(Bf16Mirror, TrainingWithTheMirrorIsBitIdenticalStepAfterStep) {
  for (const auto* cfg : {&kDense, &kMoe})
    for (int zero = 0; zero <= 3; zero++) {
      SCOPED_TRACE(::testing::Message() << (cfg == &kMoe ? "moe" : "dense") << " zero " << zero);
      const Trajectory plain = train(*cfg, zero, false, 4), mirrored = train(*cfg, zero, true, 4);
      expect_same_bits(plain, mirrored);
    }
}

TEST_P(Bf16Mirror, RemadeAfterLoadingParameters) {
  for (int zero : {0, 3}) {
    SCOPED_TRACE(::testing::Message() << "zero " << zero);
    expect_same_bits(train(kDense, zero, false, 3, true), train(kDense, zero, true, 3, true));
  }
}

INSTANTIATE_TEST_SUITE_P(Path, Bf16Mirror, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& p) { return p.param ? "native" : "emulated"; });

// The registry's mirror: only the tensors products read have one, it holds their bf16 values, and a refresh of a
// range remakes exactly the tensors in it.
TEST(Bf16Mirror, RegistryMirrorsProductTensorsOnly) {
  mt::nn::ParamRegistry params;
  mt::nn::Param& w = params.add("w", {3, 5});
  mt::nn::Param& b = params.add("b", {5});
  mt::nn::Param& v = params.add("v", {2, 4});
  w.products = v.products = true;
  params.finalize();
  for (size_t i = 0; i < params.size(); i++) params.data()[i] = 1.0f + 0.001f * (float)i;
  params.enable_mirror();
  ASSERT_TRUE(params.mirrored());
  EXPECT_EQ(b.data16, nullptr);
  ASSERT_NE(w.data16, nullptr);
  ASSERT_NE(v.data16, nullptr);
  for (size_t i = 0; i < w.numel; i++) EXPECT_EQ(w.data16[i], mt::bf16_from_f32(w.data[i])) << i;
  w.data[0] = v.data[0] = 3.0f;
  params.refresh_mirror(v.offset, v.numel);  // v only
  EXPECT_EQ(v.data16[0], mt::bf16_from_f32(3.0f));
  EXPECT_EQ(w.data16[0], mt::bf16_from_f32(1.0f));
  params.refresh_mirror();
  EXPECT_EQ(w.data16[0], mt::bf16_from_f32(3.0f));
}

}  // namespace
