// ZeRO 3 under --precision bf16 with the store's mirror (parallel/data/zero_stage.h): a group's weights that
// products alone read are all-gathered in bf16 (from each rank's shard rounded once per step), the rest in a
// packed float32 all-gather. Over 2 and 3 forked shm ranks (3: shards that cut tensors unevenly), against the
// same ranks without the mirror (every tensor gathered in float32, products rounding per product): every
// step's loss and gradient norm and the final parameters are the same bits, and the all-gathers moved about
// half the bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/gpt.h"
#include "nn/activation_store.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "shm_ranks.h"
#include "tensor/blas.h"

namespace {

constexpr int B = 6, T = 8, kSteps = 3;

struct Trajectory {
  std::vector<double> loss, norm;
  std::vector<float> params;
  uint64_t gather_bytes = 0;  // all_gather bytes this rank sent during the steps
};

Trajectory train(mt::comm::Communicator& world, const mt::model::GptConfig& cfg, bool mirror) {
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(cfg, params);
  gpt.set_precision(mt::Precision::bf16);
  mt::parallel::DataParallelOptions o;  // 8 MB buckets, float32 gradients
  o.zero = 3;
  o.bf16_mirror = mirror;
  mt::parallel::DataParallel dp(params, &world, o);
  dp.initialize([&](mt::nn::Param& p) { gpt.init_param(p, 7); });
  mt::optim::AdamW opt(dp.state_size(), {0.9f, 0.95f, 1e-8f, 0.1f});
  mt::nn::ActivationStore store;
  const int n = world.size(), per = B / n, first = world.rank() * per;
  std::vector<int32_t> in(B * T), tg(B * T);
  Trajectory t;
  const uint64_t before = world.counters().bytes_sent[(int)mt::comm::OpKind::all_gather];
  for (int s = 0; s < kSteps; s++) {
    for (int i = 0; i < B * T; i++) {
      in[i] = (i * 7 + 3 * s + 1) % cfg.vocab_size;
      tg[i] = (i * 11 + 5 * s + 2) % cfg.vocab_size;
    }
    dp.begin_step();
    dp.begin_micro_batch(0, 1);
    const double loss = gpt.forward(store, 0, in.data() + first * T, tg.data() + first * T, per, T, 1.0f / (B * T), &dp);
    gpt.backward(store, 0, per, T, &dp);
    dp.finish_backward();
    t.loss.push_back(loss);  // this rank's part of the loss sum
    t.norm.push_back(dp.grad_norm());
    dp.update(opt, 3e-2f, s);
  }
  t.gather_bytes = world.counters().bytes_sent[(int)mt::comm::OpKind::all_gather] - before;
  dp.full_params(t.params);
  return t;
}

void run(int nranks, const mt::model::GptConfig& cfg, double max_ratio) {
  auto res = mt::test::run_shm_ranks(nranks, [&](mt::comm::Communicator& world) {
    const Trajectory f32 = train(world, cfg, false), mir = train(world, cfg, true);
    for (int s = 0; s < kSteps; s++) {
      MT_REQUIRE(mt::Error, std::memcmp(&f32.loss[s], &mir.loss[s], sizeof(double)) == 0, "step ", s + 1, " loss ",
                 f32.loss[s], " vs ", mir.loss[s], " with the mirror (rank ", world.rank(), ")");
      MT_REQUIRE(mt::Error, std::memcmp(&f32.norm[s], &mir.norm[s], sizeof(double)) == 0, "step ", s + 1, " norm ",
                 f32.norm[s], " vs ", mir.norm[s], " with the mirror (rank ", world.rank(), ")");
    }
    MT_REQUIRE(mt::Error, f32.params.size() == mir.params.size() &&
                              std::memcmp(f32.params.data(), mir.params.data(), 4 * f32.params.size()) == 0,
               "parameters after ", kSteps, " steps differ with the mirror (rank ", world.rank(), ")");
    const double ratio = (double)mir.gather_bytes / (double)f32.gather_bytes;
    if (world.rank() == 0)
      std::printf("ranks %d: all_gather bytes sent per rank: float32 %llu, with the bf16 mirror %llu (%.3fx)\n",
                  nranks, (unsigned long long)f32.gather_bytes, (unsigned long long)mir.gather_bytes, ratio);
    MT_REQUIRE(mt::Error, ratio >= 0.5 && ratio <= max_ratio, "all_gather bytes with the mirror ", mir.gather_bytes,
               " vs float32 ", f32.gather_bytes, ": ratio ", ratio, " outside [0.5, ", max_ratio, "]");
  });
  EXPECT_EQ(res.exit_code, 0) << "ranks=" << nranks << ": rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace

// C = 64: the weights products alone read are 95.9% of the 102,464 parameters (the rest: LayerNorms, biases, and
// wte and wpe, which the lookup reads in float32), so the gathers move 0.5 x 0.959 + 1 x 0.041 = 0.52 of the
// float32 bytes, plus the packed float32 part's padding: measured 0.532 (2 ranks) and 0.531 (3); bound 0.55.
TEST(Bf16Zero3Gather, SameBitsWithHalfTheGatherBytes) {
  const mt::model::GptConfig dense{2, 2, 64, 29, 8};
  for (int n : {2, 3}) run(n, dense, 0.55);
}

// Measured 0.522 (the experts' biases are the float32 part besides the dense tensors').
TEST(Bf16Zero3Gather, MoeSameBits) {
  const mt::model::GptConfig moe{2, 2, 64, 29, 8, /*moe_every*/ 2, /*experts*/ 4, /*top_k*/ 2};
  run(2, moe, 0.55);
}
