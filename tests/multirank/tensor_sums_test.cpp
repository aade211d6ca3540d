// The optimizer's statistics phase in the parameter store (DataParallel::tensor_sums, optim::PieceSums): on
// forked ranks, per-tensor sums over a tensor split by ZeRO 1-3 over 2 data-parallel ranks (tiny buckets, so
// shards cut through tensors) and by tp 2 equal the whole tensor's; a tensor every tp rank holds whole is not
// summed over tp. Values are small integers, so float32 sums are exact. Also: an optimizer that asks for
// sums receives them, round by round, before its step (a tensor asked for none takes no room).
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "shm_ranks.h"

namespace {

using mt::optim::Segment;

// sum g^2, sum g, sum p over the piece; and the piece must know its place in its tensor.
const mt::optim::PieceSums kSums = [](const Segment& s, const float* p, const float* g, double* out) {
  MT_REQUIRE(mt::Error, s.param_of && s.offset + s.count <= s.param_of->numel, "piece without its tensor");
  for (size_t i = 0; i < s.count; i++) out[0] += (double)g[i] * g[i], out[1] += g[i], out[2] += p[i];
};

// Rank r's gradient at full index i of a tensor: r + 1 + i (summed over 2 ranks: 3 + 2 i); parameter i + 1.
void backward(mt::parallel::DataParallel& dp, mt::nn::ParamRegistry& params, int rank) {
  dp.begin_step();
  dp.begin_micro_batch(0, 1);
  for (int k = (int)params.params().size() - 1; k >= 0; k--) {
    mt::nn::Param& p = params.params()[k];
    dp.before_backward(p.group);
    for (size_t i = 0; i < p.numel; i++) p.grad_acc()[i] = (float)(rank + 1 + p.full_index(i));
    dp.after_backward(p.group);
  }
  dp.finish_backward();
}

void init(mt::parallel::DataParallel& dp) {
  dp.initialize([](mt::nn::Param& p) {
    for (size_t i = 0; i < p.numel; i++) p.data[i] = (float)(p.full_index(i) + 1);
  });
}

TEST(TensorSums, ZeroShardsAddUpToTheWholeTensor) {
  for (int zero = 0; zero <= 3; zero++) {
    auto res = mt::test::run_shm_ranks(
        2,
        [&](mt::comm::Communicator& world) {
          mt::nn::ParamRegistry params;
          params.add("a", {7}, {}, 0);
          params.add("b", {3, 5}, {}, 1);
          mt::parallel::DataParallelOptions o;
          o.zero = zero;
          o.bucket_mb = 6.0 * 4 / 1048576.0;  // 6-float buckets: shards cut through both tensors
          mt::parallel::DataParallel dp(params, &world, o);
          init(dp);
          backward(dp, params, world.rank());
          const std::vector<double> s = dp.tensor_sums(3, kSums);
          for (int t = 0; t < 2; t++) {
            const int64_t n = t == 0 ? 7 : 15;
            double sq = 0, sum = 0, ps = 0;
            for (int64_t i = 0; i < n; i++) sq += (3.0 + 2 * i) * (3.0 + 2 * i), sum += 3.0 + 2 * i, ps += i + 1.0;
            MT_REQUIRE(mt::Error, s[t * 3] == sq && s[t * 3 + 1] == sum && s[t * 3 + 2] == ps, "ZeRO ", zero,
                       " tensor ", t, ": sums ", s[t * 3], " ", s[t * 3 + 1], " ", s[t * 3 + 2], ", whole ", sq, " ",
                       sum, " ", ps);
          }
        },
        30);
    EXPECT_EQ(res.exit_code, 0) << "ZeRO " << zero << ": rank " << res.failed_rank << ": " << res.failure;
  }
}

// An optimizer asking, in two rounds, for the squared gradient norm of every tensor and then for the
// gradient sum of the 2-dim ones only (none of the others), recording what it got.
class Probe : public mt::optim::Sgd {
 public:
  Probe(size_t n) : Sgd(n, {}) {}
  int stat_rounds() const override { return 2; }
  size_t stat_count(int round, const mt::nn::Param& p) const override {
    return round == 0 || p.full_shape.size() == 2 ? 1 : 0;
  }
  mt::optim::PieceSums piece_sums(int round, int64_t) override {
    return [round](const Segment& s, const float*, const float* g, double* out) {
      for (size_t i = 0; i < s.count; i++) out[0] += round == 0 ? (double)g[i] * g[i] : g[i];
    };
  }
  void set_tensor_sums(int round, mt::optim::TensorSums sums) override { got_[round] = sums.sums; }
  std::vector<double> got(int round) const { return got_[round]; }

 private:
  std::vector<double> got_[2];
};

TEST(TensorSums, TpSplitTensorsSumOverTpAndTheOptimizerGetsThem) {
  auto res = mt::test::run_shm_ranks(
      2,
      [&](mt::comm::Communicator& world) {
        const int r = world.rank();
        mt::nn::ParamRegistry params;
        params.add("split", {4, 2}, {0, 2 * r, 2 * r + 2, 1});  // rows [2 r, 2 r + 2) here
        params.add("whole", {3});                               // every tp rank holds it all
        mt::parallel::DataParallel dp(params, nullptr, {});
        dp.set_tensor_group(&world);
        init(dp);
        backward(dp, params, 0);  // one data-parallel rank: gradient 1 + i
        const std::vector<double> s = dp.tensor_sums(3, kSums);
        // split: 1 .. 8 over both halves; whole: 1 .. 3 on each rank, not summed.
        MT_REQUIRE(mt::Error, s[0] == 204 && s[1] == 36 && s[2] == 36, "split: ", s[0], " ", s[1], " ", s[2]);
        MT_REQUIRE(mt::Error, s[3] == 14 && s[4] == 6 && s[5] == 6, "whole: ", s[3], " ", s[4], " ", s[5]);
        Probe opt(dp.state_size());
        dp.update(opt, 0.0f, 0);
        MT_REQUIRE(mt::Error, opt.got(0) == std::vector<double>({204, 14}), "round 0: the optimizer got other sums");
        MT_REQUIRE(mt::Error, opt.got(1) == std::vector<double>({36}), "round 1: the optimizer got other sums");
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
