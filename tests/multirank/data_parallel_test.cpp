// DataParallel (ZeRO 0-3) against the single-process computation, with ranks as forked processes over the
// shm backend: the reduced gradient each rank owns, the global gradient norm, and the parameters after one
// AdamW step must equal the serial run's (up to float32 summation order). Uneven bucket splits (tiny
// buckets, 3 ranks) and micro-batching are included.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/gpt.h"
#include "nn/activation_store.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "tensor/blas.h"
#include "shm_ranks.h"

namespace {

const mt::model::GptConfig kCfg{2, 2, 16, 29, 8};
constexpr int B = 6, T = 8;

struct Batch {
  std::vector<int32_t> in, tg;
};
Batch make_batch() {
  Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  for (int i = 0; i < B * T; i++) {
    b.in[i] = (i * 7 + 3) % kCfg.vocab_size;
    b.tg[i] = (i * 11 + 5) % kCfg.vocab_size;
  }
  return b;
}

struct Reference {
  std::vector<float> grad, params_after;
  double norm = 0, loss = 0;
};

// The serial computation: one process, whole batch, then one AdamW step.
Reference serial() {
  mt::nn::ParamRegistry params;
  mt::model::Gpt gpt(kCfg, params);
  params.finalize();
  gpt.init_gpt2(3);
  Batch b = make_batch();
  mt::nn::ActivationStore store;
  Reference r;
  r.loss = gpt.forward(store, 0, b.in.data(), b.tg.data(), B, T, 1.0f / (B * T));
  gpt.backward(store, 0, B, T);
  r.grad.assign(params.grad(), params.grad() + params.size());
  r.norm = mt::optim::global_norm(params.grad(), params.size());
  mt::optim::AdamW opt(params.size(), {0.9f, 0.95f, 1e-8f, 0.1f});
  opt.step(params.data(), params.grad(), mt::optim::segments_of(params), 1e-2f, 0);
  r.params_after.assign(params.data(), params.data() + params.size());
  return r;
}

void run_layout(int nranks, int zero, bool micro_batched, const Reference& ref) {
  auto res = mt::test::run_shm_ranks(nranks, [&](mt::comm::Communicator& world) {
    mt::nn::ParamRegistry params;
    mt::model::Gpt gpt(kCfg, params);
    mt::parallel::DataParallelOptions o;
    o.zero = zero;
    o.bucket_mb = 0.004;  // MB: several buckets
    mt::parallel::DataParallel dp(params, &world, o);
    dp.initialize([&](mt::nn::Param& p) { gpt.init_param(p, 3); });
    Batch b = make_batch();
    mt::nn::ActivationStore store;
    const int per = B / nranks, first = world.rank() * per, micro = micro_batched ? 1 : per;
    const int n_micro = per / micro;
    dp.begin_step();
    for (int i = 0; i < n_micro; i++) {
      dp.begin_micro_batch(i, n_micro);
      int j = first + i * micro;
      gpt.forward(store, 0, b.in.data() + j * T, b.tg.data() + j * T, micro, T, 1.0f / (B * T), &dp);
      gpt.backward(store, 0, micro, T, &dp);
    }
    dp.finish_backward();
    double norm = dp.grad_norm();
    MT_REQUIRE(mt::Error, std::fabs(norm - ref.norm) <= 1e-5 * ref.norm, "grad norm ", norm, " vs serial ", ref.norm);
    mt::optim::AdamW opt(dp.state_size(), {0.9f, 0.95f, 1e-8f, 0.1f});
    dp.update(opt, 1e-2f, 0);
    std::vector<float> full;
    dp.full_params(full);
    for (size_t i = 0; i < full.size(); i++) {
      // One AdamW step moves each weight by about lr; sign flips of tiny gradients aside, the result must
      // match the serial update to float32 rounding of the reduced gradient.
      MT_REQUIRE(mt::Error, std::fabs(full[i] - ref.params_after[i]) <= 2e-5, "parameter element ", i, ": ", full[i],
                 " vs serial ", ref.params_after[i], " (rank ", world.rank(), ")");
    }
    // ZeRO's bookkeeping: shards partition the flat buffer.
    size_t total = 0;
    for (auto& s : dp.segments()) total += s.count;
    std::vector<float> sizes = {(float)total}, all(1);
    world.all_reduce(sizes.data(), all.data(), 1, mt::comm::DType::f32, mt::comm::ReduceOp::sum);
    if (zero > 0)
      MT_REQUIRE(mt::Error, (size_t)all[0] == params.size(), "owned segments cover ", all[0], " of ", params.size());
  });
  EXPECT_EQ(res.exit_code, 0) << "ranks=" << nranks << " zero=" << zero << " micro-batched=" << micro_batched << ": rank "
                              << res.failed_rank << ": " << res.failure;
}

}  // namespace

class DataParallelLayouts : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(DataParallelLayouts, MatchSerialGradientNormAndUpdate) {
  static const Reference ref = serial();
  auto [n, zero, micro_batched] = GetParam();
  run_layout(n, zero, micro_batched != 0, ref);
}

INSTANTIATE_TEST_SUITE_P(Grid, DataParallelLayouts,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(0, 1)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_micro" : "");
                         });
