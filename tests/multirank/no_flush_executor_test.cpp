// PipeDream-2BW's window without a flush (parallel/pipeline/no_flush.h) run by the pipeline executor on P forked
// ranks, with a toy model that follows the delay-1 rule itself: every forward and backward of step t reads
// W(t-1) (W(-1) = W(0)), step t's gradient is clipped by its global norm over all stages and applied to W(t) at
// the list's update of step t: W(t+1) = W(t) - lr c_t g_t. The norm goes without a blocking wait: each rank
// starts sending its part after its last backward of step t and completes the receives at the update. Checked:
// the final weights of every stage equal a serial delay-1 run of the same toy model bit for bit, the runner never
// holds more than two weight versions (the one an update drops is never read again: reading it throws), each
// step's gradient accumulates apart from the next step's, and the executor called rank 0's first forward of step
// t + 1 before its last backward of step t (the flush is gone: the order the executor ran, not a time).
//
// Toy model (legend: S = P stages, s a stage, i = t m + k micro-batch k of step t, n = 5 floats per activation):
// stage s maps x to y = a_s x + b_s element-wise; the loss is 0.5 |y_{S-1}|^2 per micro-batch, so the last
// stage's output gradient is y; grad a_s += dy . x, grad b_s += sum dy, dx = a_s dy. Micro-batch i enters as
// x_k = 0.25 ((i mod 7) + 1) + 0.125 k. W(0): a_s = 1 + s / 8, b_s = s / 16 - 1 / 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/no_flush.h"
#include "shm_ranks.h"
#include "toy_stages.h"

namespace {

using mt::toy::init_of;
using mt::toy::input_of;
using mt::toy::kN;
using mt::toy::norm_part;
using mt::toy::Params;
using mt::toy::stage_forward;

constexpr float kLr = 0.01f;
constexpr double kMaxNorm = 1.0;  // small enough that most steps clip

__attribute__((noinline)) std::vector<float> stage_backward(Params w, const std::vector<float>& x,
                                                            const std::vector<float>& dy, Params& g) {
  float a = 0, b = 0;
  for (int k = 0; k < kN; k++) {
    a += dy[k] * x[k];
    b += dy[k];
  }
  g.first += a;
  g.second += b;
  std::vector<float> dx(kN);
  for (int k = 0; k < kN; k++) dx[k] = w.first * dy[k];
  return dx;
}
// parts: every stage's norm_part in stage order.
__attribute__((noinline)) Params apply(Params w, Params g, const std::vector<double>& parts) {
  double sq = 0;
  for (double x : parts) sq += x;
  const double norm = std::sqrt(sq);
  const float c = norm > kMaxNorm ? (float)(kMaxNorm / norm) : 1.0f;
  return {w.first - kLr * c * g.first, w.second - kLr * c * g.second};
}

// The serial delay-1 run: W(K) of every stage.
std::vector<Params> serial(int S, int m, int K) {
  std::vector<Params> prev(S), cur(S);
  for (int s = 0; s < S; s++) prev[s] = cur[s] = init_of(s);
  for (int t = 0; t < K; t++) {
    std::vector<Params> g(S, {0.0f, 0.0f});
    for (int k = 0; k < m; k++) {
      std::vector<std::vector<float>> xs(S + 1);
      xs[0] = input_of(t * m + k);
      for (int s = 0; s < S; s++) xs[s + 1] = stage_forward(prev[s], xs[s]);
      std::vector<float> dy = xs[S];
      for (int s = S - 1; s >= 0; s--) dy = stage_backward(prev[s], xs[s], dy, g[s]);
    }
    std::vector<double> parts(S);
    for (int s = 0; s < S; s++) parts[s] = norm_part(g[s]);
    std::vector<Params> next(S);
    for (int s = 0; s < S; s++) next[s] = apply(cur[s], g[s], parts);
    prev = cur;
    cur = next;
  }
  return cur;
}

// Rank j holds stage s = j (the looped placement, one chunk).
struct TwoBwRunner : mt::pipeline::StageRunner {
  mt::comm::Communicator& pp;
  const int s, S, m;
  std::map<int, Params> versions;             // v -> W(v): at most two at a time
  std::map<int, Params> grads;                // step -> its gradient, accumulating
  std::map<int, int> backwards;               // step -> backwards run
  std::map<int, std::vector<double>> parts;   // step -> every rank's norm part (this rank's once computed)
  std::map<int, std::vector<mt::comm::Request>> reqs;
  std::map<int, std::vector<float>> in, out;  // by micro-batch
  std::vector<float> dx;
  std::vector<std::string> calls;             // "F3", "B2", "U0" in the order the executor made them
  size_t most_versions = 0;
  int updates = 0;

  TwoBwRunner(mt::comm::Communicator& c, int m_) : pp(c), s(c.rank()), S(c.size()), m(m_) {
    versions[-1] = versions[0] = init_of(s);
  }
  Params version_for(int i) {
    const int t = i / m;
    auto it = versions.find(t - 1);
    MT_REQUIRE(mt::Error, it != versions.end(), "stage ", s, ": micro-batch ", i, " of step ", t, " needs W(", t - 1,
               "), which this rank no longer holds");
    return it->second;
  }
  size_t activation_count() const override { return kN; }
  const float* forward(int, int i, const float* input) override {
    calls.push_back("F" + std::to_string(i));
    std::vector<float> x = input ? std::vector<float>(input, input + kN) : input_of(i);
    in[i] = x;
    out[i] = stage_forward(version_for(i), x);
    return s == S - 1 ? nullptr : out[i].data();
  }
  const float* backward(int, int i, const float* g) override {
    calls.push_back("B" + std::to_string(i));
    const int t = i / m;
    std::vector<float> dy = g ? std::vector<float>(g, g + kN) : out.at(i);
    dx = stage_backward(version_for(i), in.at(i), dy, grads[t]);
    in.erase(i);
    out.erase(i);
    if (++backwards[t] == m) start_norm(t);
    return s == 0 ? nullptr : dx.data();
  }
  // After the rank's last backward of step t: its part to every other rank, their parts posted for.
  void start_norm(int t) {
    std::vector<double>& p = parts[t];
    p.assign((size_t)S, 0.0);
    p[s] = norm_part(grads.at(t));
    const int tag = (1 << 24) + t;  // above the executor's (kind, micro-batch, stage) tags
    for (int r = 0; r < S; r++) {
      if (r == s) continue;
      reqs[t].push_back(pp.isend(&p[s], sizeof(double), mt::comm::DType::u8, r, tag));
      reqs[t].push_back(pp.irecv(&p[r], sizeof(double), mt::comm::DType::u8, r, tag));
    }
  }
  // The list's update of step t (the k-th optimizer_step is step k's).
  void update() {
    const int t = updates++;
    calls.push_back("U" + std::to_string(t));
    MT_REQUIRE(mt::Error, backwards[t] == m, "stage ", s, ": update of step ", t, " after ", backwards[t], " of ", m,
               " backwards");
    mt::comm::wait_all(reqs[t]);
    versions[t + 1] = apply(versions.at(t), grads.at(t), parts.at(t));
    versions.erase(t - 1);
    most_versions = std::max(most_versions, versions.size());
    grads.erase(t);
  }
};

void run_window(int p, int m, int K) {
  const mt::pipeline::ScheduleSpec spec{"pipedream-2bw", p, m, 1};
  const std::vector<Params> want = serial(p, m, K);
  auto res = mt::test::run_shm_ranks(p, [&](mt::comm::Communicator& world) {
    const mt::pipeline::Schedule window = mt::pipeline::no_flush_schedule(spec, K);
    mt::pipeline::check_no_flush(spec, K, window);
    TwoBwRunner r(world, m);
    mt::pipeline::PipelineStats st;
    mt::pipeline::run_actions(mt::pipeline::window_spec(spec, K), window, world, r, &st, nullptr, [&] { r.update(); });
    MT_REQUIRE(mt::Error, r.updates == K, "rank ", world.rank(), ": ", r.updates, " updates for ", K, " steps");
    MT_REQUIRE(mt::Error, r.most_versions == 2, "rank ", world.rank(), " held ", r.most_versions, " weight versions");
    const Params got = r.versions.at(K);
    const Params w = want[world.rank()];
    MT_REQUIRE(mt::Error, got == w, "stage ", world.rank(), ": W(", K, ") = (", got.first, ", ", got.second,
               ") vs the serial delay-1 run's (", w.first, ", ", w.second, ")");
    // The flush is gone: on rank 0 (p > 1) the executor ran step t+1's first forward before step t's last backward.
    if (world.rank() == 0 && p > 1)
      for (int t = 0; t + 1 < K; t++) {
        auto at = [&](const std::string& c) { return std::find(r.calls.begin(), r.calls.end(), c) - r.calls.begin(); };
        MT_REQUIRE(mt::Error, at("F" + std::to_string((t + 1) * m)) < at("B" + std::to_string((t + 1) * m - 1)),
                   "rank 0 ran step ", t + 1, "'s first forward after step ", t, "'s last backward");
      }
  }, 60);
  EXPECT_EQ(res.exit_code, 0) << "p = " << p << ", m = " << m << ", K = " << K << ": rank " << res.failed_rank << ": "
                              << res.failure;
}

TEST(NoFlushExecutor, DelayOneRuleOverTheWindowEqualsSerialBitForBit) {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, p, 2 * p}) run_window(p, m, 6);
  run_window(1, 3, 4);
}

TEST(NoFlushExecutor, TheSerialRunClipsAndDependsOnTheDelay) {
  // The reference is not trivial: clipping changes the result, and the delay-1 rule differs from the exact one
  // (W(t+1) from the gradient at W(t)) -- so the equality above could fail.
  const std::vector<Params> d = serial(2, 2, 6);
  EXPECT_NE(d[0], init_of(0));
  std::vector<Params> cur = {init_of(0), init_of(1)};
  for (int t = 0; t < 6; t++) {  // the exact rule: gradient at W(t)
    std::vector<Params> g(2, {0.0f, 0.0f});
    for (int k = 0; k < 2; k++) {
      std::vector<std::vector<float>> xs(3);
      xs[0] = input_of(t * 2 + k);
      for (int s = 0; s < 2; s++) xs[s + 1] = stage_forward(cur[s], xs[s]);
      std::vector<float> dy = xs[2];
      for (int s = 1; s >= 0; s--) dy = stage_backward(cur[s], xs[s], dy, g[s]);
    }
    const std::vector<double> parts = {norm_part(g[0]), norm_part(g[1])};
    EXPECT_GT(std::sqrt(parts[0] + parts[1]), kMaxNorm) << "step " << t << " does not clip";
    for (int s = 0; s < 2; s++) cur[s] = apply(cur[s], g[s], parts);
  }
  EXPECT_NE(cur[0], d[0]);
  EXPECT_NE(cur[1], d[1]);
}

}  // namespace
