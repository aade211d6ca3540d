// The pipeline executor (parallel/pipeline/executor.h) on real ranks: for every schedule, P in 1..4, M in 1..9
// and V in 1..3 where the schedule allows, one step of a toy model runs to the end on P forked ranks and
// every stage's parameter gradients equal the serial computation bit for bit (every schedule accumulates a
// chunk's micro-batches in ascending order, as the serial loop does). The executor's stats count every
// computation.
//
// Toy model (legend: S = P V stages, s a stage, i a micro-batch, n = 5 floats per activation): stage s maps
// x to y = a_s x + b_s element-wise; the loss is 0.5 |y_{S-1}|^2 summed over micro-batches, so the last stage's
// output gradient is y itself; grad a_s += dy . x, grad b_s += sum dy, dx = a_s dy. Micro-batch i enters as
// x_k = 0.25 (i + 1) + 0.125 k.
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "shm_ranks.h"

namespace {

constexpr int kN = 5;

float a_of(int s) { return 1.0f + 0.125f * (float)s; }
float b_of(int s) { return 0.0625f * (float)s - 0.25f; }
std::vector<float> input_of(int i) {
  std::vector<float> x(kN);
  for (int k = 0; k < kN; k++) x[k] = 0.25f * (float)(i + 1) + 0.125f * (float)k;
  return x;
}

// The stage's arithmetic, one compiled copy for the serial loop and the runner (so that the compiler's
// choices, e.g. fused multiply-adds, are the same on both sides and equality can be exact).
__attribute__((noinline)) std::vector<float> stage_forward(int s, const std::vector<float>& x) {
  std::vector<float> y(kN);
  for (int k = 0; k < kN; k++) y[k] = a_of(s) * x[k] + b_of(s);
  return y;
}
// Adds the gradients of stage s to (ga, gb); returns dx.
__attribute__((noinline)) std::vector<float> stage_backward(int s, const std::vector<float>& x,
                                                            const std::vector<float>& dy, float& ga, float& gb) {
  float a = 0, b = 0;
  for (int k = 0; k < kN; k++) {
    a += dy[k] * x[k];
    b += dy[k];
  }
  ga += a;
  gb += b;
  std::vector<float> dx(kN);
  for (int k = 0; k < kN; k++) dx[k] = a_of(s) * dy[k];
  return dx;
}

// Serial: gradients (a, b) of every stage, micro-batches in ascending order.
std::vector<std::pair<float, float>> serial(int S, int m) {
  std::vector<std::pair<float, float>> g(S, {0.0f, 0.0f});
  for (int i = 0; i < m; i++) {
    std::vector<std::vector<float>> xs(S + 1);
    xs[0] = input_of(i);
    for (int s = 0; s < S; s++) xs[s + 1] = stage_forward(s, xs[s]);
    std::vector<float> dy = xs[S];
    for (int s = S - 1; s >= 0; s--) dy = stage_backward(s, xs[s], dy, g[s].first, g[s].second);
  }
  return g;
}

struct ToyRunner : mt::pipeline::StageRunner {
  const mt::pipeline::Placement& pl;
  int rank;
  std::map<std::pair<int, int>, std::vector<float>> in, out;  // (chunk, micro-batch)
  std::vector<float> dx;
  std::map<int, std::pair<float, float>> grads;  // by global stage
  int S;
  int backwards = 0;
  ToyRunner(const mt::pipeline::Placement& placement, int r) : pl(placement), rank(r), S(placement.stages()) {}
  size_t activation_count() const override { return kN; }
  const float* forward(int c, int i, const float* input) override {
    const int s = pl.stage_of(rank, c);
    std::vector<float> x = input ? std::vector<float>(input, input + kN) : input_of(i);
    MT_REQUIRE(mt::Error, (s == 0) == (input == nullptr), "stage ", s, " got input ", input != nullptr);
    in[{c, i}] = x;
    out[{c, i}] = stage_forward(s, x);
    return s == S - 1 ? nullptr : out[{c, i}].data();
  }
  const float* backward(int c, int i, const float* g) override {
    const int s = pl.stage_of(rank, c);
    backwards++;
    MT_REQUIRE(mt::Error, (s == S - 1) == (g == nullptr), "stage ", s, " got output gradient ", g != nullptr);
    const std::vector<float>& x = in.at({c, i});
    std::vector<float> dy = g ? std::vector<float>(g, g + kN) : out.at({c, i});
    dx = stage_backward(s, x, dy, grads[s].first, grads[s].second);
    return s == 0 ? nullptr : dx.data();
  }
  // The split backward (zero-bubble schedules): the input half computes dx (the same compiled arithmetic, its
  // parameter gradients thrown away) and keeps dy; the weight half adds the parameter gradients.
  std::map<std::pair<int, int>, std::vector<float>> dys;
  const float* backward_input(int c, int i, const float* g) override {
    const int s = pl.stage_of(rank, c);
    backwards++;
    MT_REQUIRE(mt::Error, (s == S - 1) == (g == nullptr), "stage ", s, " got output gradient ", g != nullptr);
    std::vector<float>& dy = dys[{c, i}];
    dy = g ? std::vector<float>(g, g + kN) : out.at({c, i});
    float unused_a = 0, unused_b = 0;
    dx = stage_backward(s, in.at({c, i}), dy, unused_a, unused_b);
    return s == 0 ? nullptr : dx.data();
  }
  void backward_weight(int c, int i) override {
    const int s = pl.stage_of(rank, c);
    stage_backward(s, in.at({c, i}), dys.at({c, i}), grads[s].first, grads[s].second);
    dys.erase({c, i});
  }
};

void run_one(const mt::pipeline::ScheduleSpec& spec) {
  const int S = spec.stages * spec.virtual_stages;
  const auto want = serial(S, spec.micro_batches);
  auto res = mt::test::run_shm_ranks(spec.stages, [&](mt::comm::Communicator& world) {
    auto lists = mt::pipeline::make_schedule(spec);
    ToyRunner r(lists.placement, world.rank());
    mt::pipeline::PipelineStats st;
    mt::pipeline::run_actions(spec, lists, world, r, &st);
    MT_REQUIRE(mt::Error, st.forwards == (int64_t)spec.micro_batches * spec.virtual_stages &&
                              st.backwards == st.forwards && st.lists == 1,
               "stats counted ", st.forwards, " forwards and ", st.backwards, " backwards");
    for (int c = 0; c < spec.virtual_stages; c++) {
      const int s = lists.placement.stage_of(world.rank(), c);
      auto got = r.grads.at(s);
      MT_REQUIRE(mt::Error, got.first == want[s].first && got.second == want[s].second, "stage ", s, ": gradients (",
                 got.first, ", ", got.second, ") vs serial (", want[s].first, ", ", want[s].second, ")");
    }
  }, 30);
  EXPECT_EQ(res.exit_code, 0) << spec.name << " P=" << spec.stages << " M=" << spec.micro_batches
                              << " V=" << spec.virtual_stages << ": rank " << res.failed_rank << ": " << res.failure;
}

TEST(PipelineExecutor, EverySchedulePMVSweepFinishesAndMatchesSerial) {
  int runs = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved"}) {
    for (int P = 1; P <= 4; P++) {
      for (int M = 1; M <= 9; M++) {
        for (int V = 1; V <= 3; V++) {
          mt::pipeline::ScheduleSpec spec{name, P, M, V};
          try {
            mt::pipeline::validate(spec);
          } catch (const mt::InputError&) {
            continue;  // not a valid combination for this schedule
          }
          run_one(spec);
          runs++;
        }
      }
    }
  }
  EXPECT_EQ(runs, 36 + 36 + 36);  // gpipe, 1f1b: 4 x 9; interleaved: V in {2, 3} and M % P == 0
}

// The zero-bubble schedules (split backward; zb-v on its V placement) on real ranks: every list runs to the end
// and every stage's gradients equal the serial ones bit for bit (each chunk's weight halves ascend).
TEST(PipelineExecutor, ZeroBubbleSchedulesMatchSerial) {
  int runs = 0;
  for (const char* name : {"zb-h1", "zb-h2", "zb-v"}) {
    for (int P = 1; P <= 4; P++) {
      for (int M = 1; M <= 6; M++) {
        run_one({name, P, M, std::string(name) == "zb-v" ? 2 : 1});
        runs++;
      }
    }
  }
  EXPECT_EQ(runs, 3 * 4 * 6);
}

// A V-shaped placement (p = 2, V = 2: stages 0, 1 down ranks 0, 1; stages 2, 3 back up ranks 1, 0), which no
// generator builds yet, built as data with a 1F1B-like order: the executor hands stage 1's output to stage 2
// in memory on rank 1, and the gradients equal the serial ones. The optimizer_step action calls the update
// once, when every backward of the rank has run.
TEST(PipelineExecutor, VShapedPlacementMatchesSerialAndStepsOnce) {
  using namespace mt::pipeline;
  const Placement pl(2, 2, {{{0, 0}, {1, 0}, {1, 1}, {0, 1}}});
  for (int m = 1; m <= 4; m++) {
    const ScheduleSpec spec{"v-shape", 2, m, 2};
    ActionLists order(2);
    for (int i = 0; i < m; i++)
      for (auto& list : order)
        list.insert(list.end(), {{ActionKind::forward, i, 0, -1},
                                 {ActionKind::forward, i, 1, -1},
                                 {ActionKind::backward, i, 1, -1},
                                 {ActionKind::backward, i, 0, -1}});
    const Schedule sched = with_communication(pl, order);
    check_schedule(spec, sched);
    const auto want = serial(4, m);
    auto res = mt::test::run_shm_ranks(
        2,
        [&](mt::comm::Communicator& world) {
          ToyRunner r(pl, world.rank());
          int steps = 0;
          run_actions(spec, sched, world, r, nullptr, nullptr, [&] {
            MT_REQUIRE(mt::Error, r.backwards == 2 * m, "the update ran after ", r.backwards, " of ", 2 * m,
                       " backwards");
            steps++;
          });
          MT_REQUIRE(mt::Error, steps == 1, "optimizer_step called the update ", steps, " times");
          for (int c = 0; c < 2; c++) {
            const int s = pl.stage_of(world.rank(), c);
            auto got = r.grads.at(s);
            MT_REQUIRE(mt::Error, got.first == want[s].first && got.second == want[s].second, "stage ", s,
                       ": gradients (", got.first, ", ", got.second, ") vs serial (", want[s].first, ", ",
                       want[s].second, ")");
          }
        },
        30);
    EXPECT_EQ(res.exit_code, 0) << "m=" << m << ": rank " << res.failed_rank << ": " << res.failure;
  }
}

}  // namespace

// Chimera (two routes: even micro-batches down, stage s on rank s chunk 0; odd ones up, on rank p - 1 - s chunk 1)
// on real ranks: every list runs to the end, and each copy of a stage holds exactly its own pipeline's micro-
// batches' gradients, accumulated in ascending order, bit for bit the serial loop over those micro-batches (the
// run then sums the two copies over their pair; test_pp_chimera.py checks that end to end).
TEST(PipelineExecutor, ChimeraCopiesHoldTheirOwnPipelinesGradients) {
  int runs = 0;
  for (int P : {2, 4}) {
    for (int M : {2, 4, 6, 8}) {
      const mt::pipeline::ScheduleSpec spec{"chimera", P, M, 2};
      // Serial over the micro-batches of each route: route r takes i = r, r + 2, ...
      std::vector<std::vector<std::pair<float, float>>> want(2, std::vector<std::pair<float, float>>(P, {0.f, 0.f}));
      for (int r = 0; r < 2; r++)
        for (int i = r; i < M; i += 2) {
          std::vector<std::vector<float>> xs(P + 1);
          xs[0] = input_of(i);
          for (int s = 0; s < P; s++) xs[s + 1] = stage_forward(s, xs[s]);
          std::vector<float> dy = xs[P];
          for (int s = P - 1; s >= 0; s--) dy = stage_backward(s, xs[s], dy, want[r][s].first, want[r][s].second);
        }
      auto res = mt::test::run_shm_ranks(P, [&](mt::comm::Communicator& world) {
        const auto lists = mt::pipeline::make_schedule(spec);
        ToyRunner r(lists.placement, world.rank());
        mt::pipeline::PipelineStats st;
        mt::pipeline::run_actions(spec, lists, world, r, &st);
        MT_REQUIRE(mt::Error, st.forwards == M && st.backwards == M, "stats counted ", st.forwards, " forwards and ",
                   st.backwards, " backwards, want ", M, " each (every micro-batch once per rank)");
        for (int c = 0; c < 2; c++) {
          const int s = lists.placement.stage_of(world.rank(), c);
          const auto got = r.grads.at(s);
          MT_REQUIRE(mt::Error, got.first == want[c][s].first && got.second == want[c][s].second, "chunk ", c,
                     " (stage ", s, "): gradients (", got.first, ", ", got.second, ") vs its pipeline's serial (",
                     want[c][s].first, ", ", want[c][s].second, ")");
        }
      }, 30);
      EXPECT_EQ(res.exit_code, 0) << "P=" << P << " M=" << M << ": rank " << res.failed_rank << ": " << res.failure;
      runs++;
    }
  }
  EXPECT_EQ(runs, 8);
}
