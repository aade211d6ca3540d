// The parameter store's hooks inside a pipeline schedule (ZeRO 2 and 3 under --pp): dp 2 x pp 2 (4 forked
// ranks) run the 1F1B lists with a stage runner that brackets every parameter group's use with the store's
// hooks, as GPT's stage runner does. Each stage holds two groups; a "tied" tensor (first and last stage each
// hold a copy, nn::Replicas::summed) sits in the first group of stage 0 and the last of stage 1.
//
// Backward of micro-batch i on dp rank r, stage j adds (i + 1)(r + 1)(j + 1) w(t, k) to element k of tensor t
// (w small integers: float32 sums are exact). After the list and the exact exchange's reduce, the gradient
// this rank owns must be the sum over the m micro-batches and both dp ranks, m(m + 1)/2 * 3 * (j + 1) w, and
// for the tied tensor that sum over both stages (its copies summed over the tie group before the store
// reduced its bucket). Also: ZeRO 3 binds each group's whole parameters for exactly its forward and its
// backward (the initial values, checked inside the bracket; unbound outside), and ZeRO 2 reduces each bucket
// once per step whatever m (bytes sent over dp with m = 4 equal those with m = 1).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/param_hooks.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "parallel/pipeline/executor.h"
#include "shm_ranks.h"
#include "train/grad_sync.h"

namespace {

using mt::nn::Param;
using mt::nn::ParamRegistry;

float w(const std::string& name, size_t k) { return (float)((std::hash<std::string>{}(name) % 5 + k) % 5) - 2.0f; }
float init_value(const std::string& name, size_t k) { return 0.25f * w(name, k + 1) + 1.0f; }

// Stage j's tensors: stage 0 = groups {0: tied, a}, {1: b}; stage 1 = groups {2: c}, {3: d, tied}.
void declare_stage(ParamRegistry& params, int j) {
  auto tied = [&](int group) {
    Param& p = params.add("tied", {6, 4}, {}, group);
    p.replicas.groups = (uint8_t)mt::nn::CopyGroup::tie;
    p.replicas.summed = true;
    p.replicas.counted = p.replicas.saved = j == 0;
  };
  if (j == 0) {
    tied(0);
    params.add("a", {5, 3}, {}, 0);
    params.add("b", {7}, {}, 1);
  } else {
    params.add("c", {4, 4}, {}, 2);
    params.add("d", {9}, {}, 3);
    tied(3);
  }
}

// Brackets each of the stage's groups with the hooks (nn::GroupHooks: as a model does), checks ZeRO 3's
// gathered parameters inside the brackets, and writes the backward's gradient contributions.
class HookedStage : public mt::pipeline::StageRunner {
 public:
  HookedStage(ParamRegistry& params, mt::nn::ParamHooks* hooks, int zero, int dp_rank, int stage)
      : params_(params), hooks_(params, hooks), zero_(zero), r_(dp_rank), j_(stage), act_(4, 0.0f) {
    for (const Param& p : params.params())
      if (groups_.empty() || groups_.back() != p.group) groups_.push_back(p.group);
  }
  size_t activation_count() const override { return act_.size(); }
  const float* forward(int, int, const float*) override {
    for (int g : groups_) {
      hooks_.before_forward(g);
      check_bound(g, true);
      hooks_.after_forward(g);
      check_bound(g, false);
    }
    return j_ == 1 ? nullptr : act_.data();
  }
  const float* backward(int, int i, const float*) override {
    for (auto it = groups_.rbegin(); it != groups_.rend(); ++it) {
      hooks_.before_backward(*it);
      check_bound(*it, true);
      for (Param& p : params_.params()) {
        if (p.group != *it) continue;
        float* g = p.grad_acc();
        for (size_t k = 0; k < p.numel; k++) g[k] += (float)((i + 1) * (r_ + 1) * (j_ + 1)) * w(p.name, k);
      }
      hooks_.after_backward(*it);
      check_bound(*it, false);
    }
    return j_ == 0 ? nullptr : act_.data();
  }

 private:
  // ZeRO 3: a group's parameters are whole and hold their values inside its bracket, unbound outside.
  void check_bound(int g, bool inside) {
    if (zero_ != 3) return;
    for (const Param& p : params_.params()) {
      if (p.group != g) continue;
      MT_REQUIRE(mt::Error, (p.data != nullptr) == inside, "stage ", j_, ": ", p.name, " is ",
                 p.data ? "bound" : "unbound", inside ? " inside" : " outside", " its group's bracket");
      for (size_t k = 0; inside && k < p.numel; k++)
        MT_REQUIRE(mt::Error, p.data[k] == init_value(p.name, k), "stage ", j_, ": ", p.name, "[", k, "] = ", p.data[k],
                   " inside its bracket, initialized to ", init_value(p.name, k));
    }
  }
  ParamRegistry& params_;
  mt::nn::GroupHooks hooks_;
  int zero_, r_, j_;
  std::vector<int> groups_;
  std::vector<float> act_;
};

// One step of m micro-batches on this rank; checks the owned gradient, returns the bytes sent over dp.
uint64_t one_step(const mt::parallel::Mesh& mesh, int zero, int m) {
  const int j = mesh.coord().pp, r = mesh.coord().dp;
  ParamRegistry params;
  declare_stage(params, j);
  mt::train::SyncOptions o;
  o.engine.zero = zero;
  o.overlapped = true;  // the stage runner calls the store's hooks
  const mt::train::StoreGroups on = mt::train::store_groups(o, mesh);
  mt::parallel::DataParallel store(params, on.group, o.engine, on.experts);
  store.initialize([](Param& p) {
    for (size_t k = 0; k < p.numel; k++) p.data[k] = init_value(p.name, k);
  });
  mt::trace::ChromeTrace tracer;
  auto sync = mt::train::make_grad_sync(o, mesh, store, params, &tracer);
  const uint64_t sent0 = mesh.dp()->counters().total_sent();
  sync->begin_step(0);
  const mt::train::StepHooks hooks = sync->hooks();
  hooks.accumulate(m);
  HookedStage runner(params, hooks.params, zero, r, j);
  const mt::pipeline::ScheduleSpec spec{"1f1b", 2, m, 1};
  int updates = 0;
  mt::pipeline::run_actions(spec, mt::pipeline::make_schedule(spec), *mesh.pp(), runner, nullptr, nullptr, [&] {
    sync->reduce(0);
    updates++;
  });
  MT_REQUIRE(mt::Error, updates == 1, "the list ran ", updates, " optimizer steps");
  const uint64_t sent = mesh.dp()->counters().total_sent() - sent0;
  // The pieces of the reduced gradient this rank owns (the statistics phase's view of them).
  const float sum_ir = (float)(m * (m + 1) / 2) * 3.0f;
  size_t seen = 0;
  store.tensor_sums(1, [&](const mt::optim::Segment& sg, const float*, const float* g, double*) {
    const Param& p = params.params()[sg.tensor];
    const float stages = p.replicas.summed ? 1.0f + 2.0f : (float)(j + 1);
    for (size_t k = 0; k < sg.count; k++) {
      const float want = sum_ir * stages * w(p.name, sg.offset + k);
      MT_REQUIRE(mt::Error, g[k] == want, "ZeRO ", zero, ", m ", m, ", stage ", j, ", dp rank ", r, ": ", p.name, "[",
                 sg.offset + k, "] reduced gradient ", g[k], ", want ", want);
    }
    seen += sg.count;
  });
  MT_REQUIRE(mt::Error, seen > 0, "no owned gradient on dp rank ", r, " of stage ", j);
  return sent;
}

TEST(PipelineStoreHooks, Zero2And3ReduceOncePerStepGatherPerUseAndSumTheTie) {
  auto res = mt::test::run_shm_ranks(
      4,
      [&](mt::comm::Communicator& world) {
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(4, 2, 1, 2));
        for (int zero : {2, 3}) {
          const uint64_t one = one_step(mesh, zero, 1), four = one_step(mesh, zero, 4);
          if (zero == 2)
            MT_REQUIRE(mt::Error, one == four, "ZeRO 2: ", four, " bytes sent over dp with 4 micro-batches, ", one,
                       " with 1: buckets must be reduced once per step");
          else
            MT_REQUIRE(mt::Error, four > one, "ZeRO 3: ", four, " bytes with 4 micro-batches, ", one,
                       " with 1: each use gathers its group");
        }
      },
      60);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
