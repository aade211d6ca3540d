// The back-to-back window of the synchronous one-chunk schedules (parallel/pipeline/sync_window.h: 1f1b, zb-h1,
// zb-h2) run by the pipeline executor on P forked ranks, with a toy model whose update is the exact synchronous
// rule with global-norm clipping: W(t+1) = W(t) - lr c_t g_t, c_t = min(1, max / |g_t|), |g_t| over every stage.
// The norm travels as sync_window.h describes: at its update of step t, rank s takes the per-stage parts from rank
// s + 1, puts its own in and passes them to rank s - 1; rank 0 then holds every part and passes the whole set back
// down, one rank at a time; each rank sums the parts in stage order (as the serial run does) and updates. Checked:
// every stage's W(K) equals a serial run of the same toy model bit for bit, with clipping active in the even steps
// (threshold 1) and off in the odd ones; each rank's update of step t came after all its computations of step t and before any of step
// t + 1 (the order the executor ran, not a time).
//
// Toy model (legend: S = P stages, s a stage, i = t m + k micro-batch k of step t, n = 5 floats per activation):
// stage s maps x to y = a_s x + b_s element-wise; the loss is 0.5 |y_{S-1}|^2 per micro-batch, so the last stage's
// output gradient is y; the input half gives dx = a_s dy, the weight half grad a_s += dy . x, grad b_s += sum dy.
// Micro-batch i enters as x_k = 0.25 ((i mod 7) + 1) + 0.125 k. W(0): a_s = 1 + s / 8, b_s = s / 16 - 1 / 4.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/sync_window.h"
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
// The clipping threshold of step t: 1 in even steps (every norm here is larger: they clip), none in odd ones, so the
// window has steps of both kinds (asserted per case).
double max_norm(int t) { return t % 2 == 0 ? 1.0 : 1e30; }

__attribute__((noinline)) std::vector<float> input_half(Params w, const std::vector<float>& dy) {
  std::vector<float> dx(kN);
  for (int k = 0; k < kN; k++) dx[k] = w.first * dy[k];
  return dx;
}
__attribute__((noinline)) void weight_half(const std::vector<float>& x, const std::vector<float>& dy, Params& g) {
  float a = 0, b = 0;
  for (int k = 0; k < kN; k++) {
    a += dy[k] * x[k];
    b += dy[k];
  }
  g.first += a;
  g.second += b;
}
// parts: every stage's norm_part in stage order. clipped: whether c < 1.
__attribute__((noinline)) Params apply(Params w, Params g, const std::vector<double>& parts, int t, bool* clipped) {
  double sq = 0;
  for (double x : parts) sq += x;
  const double norm = std::sqrt(sq);
  const float c = norm > max_norm(t) ? (float)(max_norm(t) / norm) : 1.0f;
  if (clipped) *clipped = c < 1.0f;
  return {w.first - kLr * c * g.first, w.second - kLr * c * g.second};
}

// The serial synchronous run: W(K) of every stage, and per step whether it clipped.
std::vector<Params> serial(int S, int m, int K, std::vector<bool>& clipped) {
  std::vector<Params> w(S);
  for (int s = 0; s < S; s++) w[s] = init_of(s);
  clipped.assign((size_t)K, false);
  for (int t = 0; t < K; t++) {
    std::vector<Params> g(S, {0.0f, 0.0f});
    for (int k = 0; k < m; k++) {
      std::vector<std::vector<float>> xs(S + 1);
      xs[0] = input_of(t * m + k);
      for (int s = 0; s < S; s++) xs[s + 1] = stage_forward(w[s], xs[s]);
      std::vector<float> dy = xs[S];
      for (int s = S - 1; s >= 0; s--) {
        weight_half(xs[s], dy, g[s]);
        dy = input_half(w[s], dy);
      }
    }
    std::vector<double> parts(S);
    for (int s = 0; s < S; s++) parts[s] = norm_part(g[s]);
    bool c = false;
    for (int s = 0; s < S; s++) w[s] = apply(w[s], g[s], parts, t, s == 0 ? &c : nullptr);
    clipped[(size_t)t] = c;
  }
  return w;
}

// Rank j holds stage s = j (the looped placement, one chunk).
struct SyncRunner : mt::pipeline::StageRunner {
  mt::comm::Communicator& pp;
  const int s, S, m;
  Params w;
  Params g{0.0f, 0.0f};
  std::map<int, std::vector<float>> in, out, dys;  // by micro-batch
  std::vector<float> dx;
  std::vector<std::string> calls;  // "F3", "I2", "W2", "B2", "U0" in the order the executor made them
  std::vector<bool> clipped;
  int updates = 0;

  SyncRunner(mt::comm::Communicator& c, int m_) : pp(c), s(c.rank()), S(c.size()), m(m_), w(init_of(s)) {}
  void expect_step(int i) {
    MT_REQUIRE(mt::Error, i / m == updates, "stage ", s, ": micro-batch ", i, " of step ", i / m, " computed after ",
               updates, " updates");
  }
  size_t activation_count() const override { return kN; }
  const float* forward(int, int i, const float* input) override {
    expect_step(i);
    calls.push_back("F" + std::to_string(i));
    std::vector<float> x = input ? std::vector<float>(input, input + kN) : input_of(i);
    in[i] = x;
    out[i] = stage_forward(w, x);
    return s == S - 1 ? nullptr : out[i].data();
  }
  const float* backward_input(int, int i, const float* grad) override {
    expect_step(i);
    calls.push_back("I" + std::to_string(i));
    dys[i] = grad ? std::vector<float>(grad, grad + kN) : out.at(i);
    dx = input_half(w, dys[i]);
    return s == 0 ? nullptr : dx.data();
  }
  void backward_weight(int, int i) override {
    expect_step(i);
    calls.push_back("W" + std::to_string(i));
    weight_half(in.at(i), dys.at(i), g);
    in.erase(i);
    out.erase(i);
    dys.erase(i);
  }
  // 1F1B's whole backward: the weight half first, then the input half (the serial run's order; both read the same w).
  const float* backward(int c, int i, const float* grad) override {
    expect_step(i);
    calls.push_back("B" + std::to_string(i));
    const std::vector<float> dy = grad ? std::vector<float>(grad, grad + kN) : out.at(i);
    weight_half(in.at(i), dy, g);
    dx = input_half(w, dy);
    in.erase(i);
    out.erase(i);
    return s == 0 ? nullptr : dx.data();
  }
  // The list's update of step t: the parts up the pipeline to rank 0, the whole set back down, then the update.
  void update() {
    const int t = updates;
    calls.push_back("U" + std::to_string(t));
    const int up = (1 << 24) + 2 * t, down = up + 1;  // above the executor's (kind, micro-batch, stage) tags
    std::vector<double> parts((size_t)S, 0.0);
    if (s + 1 < S) pp.recv(parts.data(), parts.size() * sizeof(double), mt::comm::DType::u8, s + 1, up);
    parts[(size_t)s] = norm_part(g);
    if (s > 0) {
      pp.send(parts.data(), parts.size() * sizeof(double), mt::comm::DType::u8, s - 1, up);
      pp.recv(parts.data(), parts.size() * sizeof(double), mt::comm::DType::u8, s - 1, down);
    }
    if (s + 1 < S) pp.send(parts.data(), parts.size() * sizeof(double), mt::comm::DType::u8, s + 1, down);
    bool c = false;
    w = apply(w, g, parts, t, &c);
    clipped.push_back(c);
    g = {0.0f, 0.0f};
    updates++;
  }
};

void run_window(const char* name, int p, int m, int K) {
  const mt::pipeline::ScheduleSpec spec{name, p, m, 1};
  std::vector<bool> want_clipped;
  const std::vector<Params> want = serial(p, m, K, want_clipped);
  int clipped_steps = 0;
  for (bool c : want_clipped) clipped_steps += c ? 1 : 0;
  // The test means something only when the factor matters in some steps and not in others.
  EXPECT_GT(clipped_steps, 0) << name << " p=" << p << " m=" << m;
  EXPECT_LT(clipped_steps, K) << name << " p=" << p << " m=" << m;
  auto res = mt::test::run_shm_ranks(p, [&](mt::comm::Communicator& world) {
    const mt::pipeline::Schedule window = mt::pipeline::sync_window_schedule(spec, K);
    mt::pipeline::check_sync_window(spec, K, window);
    SyncRunner r(world, m);
    mt::pipeline::run_actions(mt::pipeline::window_spec(spec, K), window, world, r, nullptr, nullptr,
                              [&] { r.update(); });
    MT_REQUIRE(mt::Error, r.updates == K, "rank ", world.rank(), ": ", r.updates, " updates for ", K, " steps");
    MT_REQUIRE(mt::Error, r.clipped == want_clipped, "rank ", world.rank(), ": clipped in other steps than serially");
    const Params w = want[world.rank()];
    MT_REQUIRE(mt::Error, r.w == w, "stage ", world.rank(), ": W(", K, ") = (", r.w.first, ", ", r.w.second,
               ") vs the serial run's (", w.first, ", ", w.second, ")");
    // Every computation of step t between U(t - 1) and U(t) in the order the executor ran them.
    int step = 0;
    for (const std::string& c : r.calls) {
      if (c[0] == 'U') {
        MT_REQUIRE(mt::Error, std::stoi(c.substr(1)) == step, "rank ", world.rank(), ": ", c, " out of order");
        step++;
      } else {
        MT_REQUIRE(mt::Error, std::stoi(c.substr(1)) / m == step, "rank ", world.rank(), ": ", c, " in step ", step);
      }
    }
  }, 60);
  EXPECT_EQ(res.exit_code, 0) << name << " p = " << p << ", m = " << m << ", K = " << K << ": rank " << res.failed_rank
                              << ": " << res.failure;
}

TEST(SyncWindowExecutor, ClippedUpdatesWithTheNormPassedAlongEqualTheSerialRunBitForBit) {
  for (const char* name : {"1f1b", "zb-h1", "zb-h2"})
    for (int p : {2, 4})
      for (int m : {p, 2 * p}) run_window(name, p, m, 5);
}

}  // namespace
