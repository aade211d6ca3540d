// DataParallel with expert tensors (nn::Param::expert) on 4 forked ranks over shm, as a dp=4, ep=2 mesh cuts
// them: expert tensors reduce over the 2 ranks at the same place of the two ep runs (rank % 2), everything
// else over all 4. Gradients are small integers (rank, tensor and element encoded), so every sum is exact and
// the checks are equalities: the reduced gradient (read back through a plain SGD step with lr 1 from zero
// parameters, all-gathered as the stage does), the global norm (each expert element counted once over the
// two places), and the optimizer's segments covering the dense elements once over the 4 ranks and each
// place's expert elements once over its 2 (ZeRO 1-3; ZeRO 0: every rank all of its own). ZeRO 3 gathers each
// group's buckets (dense and expert) around its hooks, as a model's use of them would.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "tensor/blas.h"
#include "shm_ranks.h"

namespace {

constexpr int kRanks = 4, kEp = 2;

// The gradient rank r writes into element i of tensor t (t = 0.. in registry order).
float grad_value(int r, int t, size_t i) { return (float)((r + 1) * (t + 2) + (int)(i % 5) - 2); }

struct Layout {
  const char* name;
  int group;
  int numel;
  bool expert;
};
// Group 1 holds a dense tensor and then this rank's expert tensors (as an MoE block's router and experts).
const std::vector<Layout> kTensors = {
    {"emb", 0, 12, false}, {"h.0.w", 1, 8, false}, {"h.0.router", 1, 6, false},
    {"h.0.experts.w", 1, 10, true}, {"h.0.experts.b", 1, 3, true}, {"ln_f", 2, 4, false}};

void run(int zero) {
  auto res = mt::test::run_shm_ranks(kRanks, [&](mt::comm::Communicator& world) {
    const int r = world.rank(), place = r % kEp;
    std::unique_ptr<mt::comm::Communicator> edp = world.split(place, r / kEp, "edp");
    mt::nn::ParamRegistry params;
    for (const Layout& l : kTensors) params.add(l.name, {l.numel}, {}, l.group).expert = l.expert;
    mt::parallel::DataParallelOptions o;  // 8 MB buckets, float32 gradients
    o.zero = zero;
    mt::parallel::DataParallel dp(params, &world, o, edp.get());
    dp.initialize([](mt::nn::Param& p) {
      for (size_t i = 0; i < p.numel; i++) p.data[i] = 0;
    });
    dp.begin_step();
    dp.begin_micro_batch(0, 1);
    for (int g = 2; g >= 0; g--) {
      dp.before_backward(g);
      for (const mt::nn::Param& p : params.params())  // ZeRO 3: the group's parameters are gathered (zeros)
        if (p.group == g)
          for (size_t i = 0; i < p.numel; i++)
            MT_REQUIRE(mt::Error, p.data && p.data[i] == 0.0f, p.name, " not gathered before backward");
      int t = 0;
      for (mt::nn::Param& p : params.params()) {
        if (p.group == g)
          for (size_t i = 0; i < p.numel; i++) p.grad[i] = grad_value(r, t, i);
        t++;
      }
      dp.after_backward(g);
    }
    dp.finish_backward();
    // Expected reduced gradients: dense over all 4 ranks, experts over the ranks of this place; the norm
    // over dense once and both places' experts once.
    double want_sq = 0;
    std::vector<std::vector<float>> want(kTensors.size());
    for (size_t t = 0; t < kTensors.size(); t++) {
      for (int i = 0; i < kTensors[t].numel; i++) {
        float mine = 0;
        for (int q = 0; q < kRanks; q++)
          if (!kTensors[t].expert || q % kEp == place) mine += grad_value(q, (int)t, i);
        want[t].push_back(mine);
        if (!kTensors[t].expert) {
          want_sq += (double)mine * mine;
        } else {
          for (int pl = 0; pl < kEp; pl++) {
            float s = 0;
            for (int q = pl; q < kRanks; q += kEp) s += grad_value(q, (int)t, i);
            want_sq += (double)s * s;
          }
        }
      }
    }
    const double norm = dp.grad_norm();
    MT_REQUIRE(mt::Error, norm * norm == want_sq || std::fabs(norm * norm - want_sq) <= 1e-6 * want_sq,
               "zero ", zero, " rank ", r, ": grad norm^2 ", norm * norm, " vs ", want_sq);
    mt::optim::Sgd opt(dp.state_size(), {0.0f, 0.0f});
    dp.update(opt, 1.0f, 0);  // parameters = -reduced gradient, gathered back where the stage shards
    std::vector<float> flat;
    dp.full_params(flat);  // every stage: this rank's registry whole (ZeRO 3 gathers it)
    int t = 0;
    for (const mt::nn::Param& p : params.params()) {
      for (size_t i = 0; i < p.numel; i++)
        MT_REQUIRE(mt::Error, flat[p.offset + i] == -want[t][i], "zero ", zero, " rank ", r, ": ", p.name, "[", i,
                   "] = ", flat[p.offset + i], ", want ", -want[t][i]);
      t++;
    }
    // Owned state: dense elements once over the 4 ranks, each place's experts once over its 2 ranks.
    float owned[2] = {0, 0};
    for (const mt::optim::Segment& s : dp.segments()) owned[params.params()[s.tensor].expert ? 1 : 0] += (float)s.count;
    world.all_reduce(owned, owned, 2, mt::comm::DType::f32, mt::comm::ReduceOp::sum);
    const float dense = 12 + 8 + 6 + 4, experts = 10 + 3;
    const float want_dense = zero ? dense : dense * kRanks, want_exp = zero ? experts * kEp : experts * kRanks;
    MT_REQUIRE(mt::Error, owned[0] == want_dense && owned[1] == want_exp, "zero ", zero, ": owned elements ",
               owned[0], " dense, ", owned[1], " expert; want ", want_dense, ", ", want_exp);
    // Loading whole parameters back keeps each rank's part: a second gather returns them unchanged.
    for (float& v : flat) v = -v;
    dp.load_full_params(flat.data());
    std::vector<float> again;
    dp.full_params(again);
    MT_REQUIRE(mt::Error, again == flat, "zero ", zero, " rank ", r, ": load_full_params + full_params changed values");
  });
  EXPECT_EQ(res.exit_code, 0) << "zero " << zero << ": rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace

TEST(ExpertGradGroup, Zero0ReducesExpertsOverTheirReplicasOnly) { run(0); }
TEST(ExpertGradGroup, Zero1ShardsExpertsOverTheirReplicasOnly) { run(1); }
TEST(ExpertGradGroup, Zero2ShardsExpertGradientsOverTheirReplicasOnly) { run(2); }
TEST(ExpertGradGroup, Zero3ShardsExpertParametersOverTheirReplicasOnly) { run(3); }
