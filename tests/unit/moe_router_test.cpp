// MoE gating (nn/moe_router.h) on hand-written routings: capacity arithmetic, admission order (first choices
// before second choices, GShard's rule), dropless mode, gates, the auxiliary losses' closed forms, the random
// second-choice policy against its own definition, and route_backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "gradcheck.h"
#include "nn/moe_router.h"

namespace mt::nn {
namespace {

// Logits that make token t prefer experts in the order given (first > second > the rest), with margins
// large enough that softmax keeps the order in float32.
std::vector<float> prefer(int E, const std::vector<std::vector<int>>& order) {
  std::vector<float> z(order.size() * E, 0.0f);
  for (size_t t = 0; t < order.size(); t++) {
    float v = 4.0f;
    for (int e : order[t]) z[t * E + e] = v, v -= 1.0f;
  }
  return z;
}

TEST(MoeRouter, CapacityIsCeilOfFactorTimesChoicesTimesTokensOverExperts) {
  auto cap = [](double F, int K, int Ng, int E) { return expert_capacity({E, K, F, Ng, SecondPolicy::all}); };
  EXPECT_EQ(cap(1.0, 1, 8, 4), 2);
  EXPECT_EQ(cap(1.25, 2, 8, 4), 5);   // 5.0 exactly
  EXPECT_EQ(cap(1.1, 2, 8, 4), 5);    // 4.4 -> 5
  EXPECT_EQ(cap(0.01, 1, 8, 4), 1);   // any positive factor admits at least one
  EXPECT_EQ(cap(0.0, 2, 8, 4), 8);    // dropless: every token once per expert
  EXPECT_EQ(cap(100.0, 2, 8, 4), 8);  // never more slots than tokens
}

TEST(MoeRouter, OverfullExpertDropsTheLaterTokens) {
  // Six tokens all prefer expert 0 (E = 3, top-1, F = 1: cap = ceil(6/3) = 2).
  const int E = 3, N = 6;
  std::vector<std::vector<int>> order(N, {0, 1, 2});
  auto z = prefer(E, order);
  Routing r;
  route(z.data(), N, {E, 1, 1.0, N, SecondPolicy::all}, {}, r);
  EXPECT_EQ(r.slot[0], 0);
  EXPECT_EQ(r.slot[1], 1);
  for (int t = 2; t < N; t++) {
    EXPECT_EQ(r.slot[t], -1) << "token " << t;
    EXPECT_EQ(r.gate[t], 0.0f) << "a dropped choice has no gate";
  }
  EXPECT_EQ(r.choices, 6);
  EXPECT_EQ(r.dropped, 4);
  EXPECT_EQ(r.group_count[0], 2);
}

TEST(MoeRouter, SecondChoicesAreAdmittedAfterAllFirstChoicesOfTheGroup) {
  // E = 4, K = 2, Ng = 4, F = 1.5: cap = ceil(1.5 * 2 * 4 / 4) = 3.
  // t0: 0 then 1; t1: 0 then 2; t2: 1 then 0; t3: 0 then 3.
  // First choices: expert 0 gets t0, t1, t3 (slots 0, 1, 2: full); expert 1 gets t2.
  // Second choices in token order: t0 -> 1 (slot 1), t1 -> 2 (slot 0), t2 -> 0 dropped (expert 0 full even
  // though t2 comes before t3: first choices go first), t3 -> 3 (slot 0).
  const int E = 4, N = 4;
  auto z = prefer(E, {{0, 1}, {0, 2}, {1, 0}, {0, 3}});
  Routing r;
  route(z.data(), N, {E, 2, 1.5, N, SecondPolicy::all}, {}, r);
  const std::vector<int> expert = {0, 1, 0, 2, 1, 0, 0, 3};
  const std::vector<int> slot = {0, 1, 1, 0, 0, -1, 2, 0};
  for (int i = 0; i < 2 * N; i++) {
    EXPECT_EQ(r.expert[i], expert[i]) << "choice " << i;
    EXPECT_EQ(r.slot[i], slot[i]) << "choice " << i;
  }
  EXPECT_EQ(r.dropped, 1);
  // t2 keeps its first choice's gate, renormalized over the two it picked.
  const float p1 = r.probs[2 * E + 1], p0 = r.probs[2 * E + 0];
  EXPECT_FLOAT_EQ(r.gate[4], p1 / (p1 + p0));
  EXPECT_EQ(r.gate[5], 0.0f);
}

TEST(MoeRouter, GroupsAreAdmittedIndependently) {
  // Two groups of 3 tokens, all to expert 1, cap = ceil(1 * 3 / 3) = 1: the first token of each group gets in.
  const int E = 3, N = 6;
  std::vector<std::vector<int>> order(N, {1, 0, 2});
  auto z = prefer(E, order);
  Routing r;
  route(z.data(), N, {E, 1, 1.0, 3, SecondPolicy::all}, {}, r);
  const std::vector<int> slot = {0, -1, -1, 0, -1, -1};
  for (int t = 0; t < N; t++) EXPECT_EQ(r.slot[t], slot[t]) << "token " << t;
  EXPECT_EQ(r.group_count[0 * E + 1], 1);
  EXPECT_EQ(r.group_count[1 * E + 1], 1);
}

TEST(MoeRouter, DroplessAdmitsEverything) {
  const int E = 4, N = 16;
  std::vector<std::vector<int>> order(N, {2, 3});  // everything to experts 2 and 3
  auto z = prefer(E, order);
  Routing r;
  route(z.data(), N, {E, 2, 0.0, 8, SecondPolicy::all}, {}, r);
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.choices, 2 * N);
  for (int i = 0; i < 2 * N; i++) EXPECT_GE(r.slot[i], 0);
}

TEST(MoeRouter, GatesSumToOneForTopTwoAndAreTheTopProbabilityForTopOne) {
  const int E = 5, N = 32;
  auto z = testing::randn((size_t)N * E, 7, "logits", 2.0f);
  Routing r2, r1;
  route(z.data(), N, {E, 2, 0.0, N, SecondPolicy::all}, {}, r2);
  route(z.data(), N, {E, 1, 0.0, N, SecondPolicy::all}, {}, r1);
  for (int t = 0; t < N; t++) {
    EXPECT_NEAR(r2.gate[2 * t] + r2.gate[2 * t + 1], 1.0f, 1e-6f);
    EXPECT_GE(r2.gate[2 * t], r2.gate[2 * t + 1]);
    double best = 0;
    for (int e = 0; e < E; e++) best = std::max(best, (double)r1.probs[t * E + e]);
    EXPECT_EQ(r1.gate[t], (float)best);
    // Probabilities from an independent double-precision softmax.
    double m = z[t * E], s = 0;
    for (int e = 1; e < E; e++) m = std::max(m, (double)z[t * E + e]);
    for (int e = 0; e < E; e++) s += std::exp(z[t * E + e] - m);
    for (int e = 0; e < E; e++) EXPECT_NEAR(r1.probs[t * E + e], std::exp(z[t * E + e] - m) / s, 1e-6);
    EXPECT_NEAR(r1.lse[t], m + std::log(s), 1e-5);
  }
}

TEST(MoeRouter, TiesGoToTheLowerIndex) {
  const int E = 4;
  std::vector<float> z = {1.0f, 3.0f, 3.0f, 3.0f};
  Routing r;
  route(z.data(), 1, {E, 2, 0.0, 1, SecondPolicy::all}, {}, r);
  EXPECT_EQ(r.expert[0], 1);
  EXPECT_EQ(r.expert[1], 2);
}

TEST(MoeRouter, AuxLossIsOneAtEvenRoutingAndEWhenEveryTokenPicksOneExpert) {
  // Even: E = 2, tokens alternate (a, 0) and (0, a): f = (1/2, 1/2), P = (1/2, 1/2), E sum f P = 1.
  const int N = 8;
  std::vector<float> even(N * 2, 0.0f);
  for (int t = 0; t < N; t++) even[t * 2 + (t % 2)] = 1.5f;
  Routing r;
  route(even.data(), N, {2, 1, 0.0, 4, SecondPolicy::all}, {}, r);
  EXPECT_NEAR(r.aux_sum / 2, 1.0, 1e-6);  // mean over the 2 groups: alpha * 1 = alpha
  // Collapsed: E = 4, every token gives expert 3 probability ~1: f_3 = 1, P_3 ~ 1, E sum f P = E.
  const int E = 4;
  std::vector<float> one(N * E, 0.0f);
  for (int t = 0; t < N; t++) one[t * E + 3] = 30.0f;
  route(one.data(), N, {E, 1, 0.0, N, SecondPolicy::all}, {}, r);
  EXPECT_NEAR(r.aux_sum, (double)E, 1e-5);
  EXPECT_EQ(r.first_load[3], N);
}

TEST(MoeRouter, ZLossIsTheSquaredLogSumExp) {
  const int E = 3, N = 4;
  auto z = testing::randn((size_t)N * E, 3, "z", 3.0f);
  Routing r;
  route(z.data(), N, {E, 1, 0.0, N, SecondPolicy::all}, {}, r);
  double want = 0;
  for (int t = 0; t < N; t++) {
    double s = 0;
    for (int e = 0; e < E; e++) s += std::exp((double)z[t * E + e]);
    want += std::log(s) * std::log(s);
  }
  EXPECT_NEAR(r.z_sum, want, 1e-4 * want);
}

TEST(MoeRouter, RandomSecondPolicyKeepsTheSecondWhenTwiceItsGateBeatsTheDraw) {
  const int E = 4, N = 2000;
  auto z = testing::randn((size_t)N * E, 11, "logits", 1.0f);
  Routing r;
  const RouterDraws draws{42, 7, 3, 1000};
  route(z.data(), N, {E, 2, 0.0, 100, SecondPolicy::random}, draws, r);
  const CounterRng rng(42, "moe.second.7.3");
  int kept = 0;
  double expected = 0;
  for (int t = 0; t < N; t++) {
    // Recompute the renormalized second gate from the probabilities.
    std::vector<float> p(r.probs.begin() + t * E, r.probs.begin() + (t + 1) * E);
    int i1 = 0;
    for (int e = 1; e < E; e++)
      if (p[e] > p[i1]) i1 = e;
    int i2 = i1 == 0 ? 1 : 0;
    for (int e = 0; e < E; e++)
      if (e != i1 && p[e] > p[i2]) i2 = e;
    const float s2 = p[i2] / (p[i1] + p[i2]);
    const bool keep = 2.0 * s2 > rng.uniform(1000 + t);
    EXPECT_EQ(r.expert[2 * t + 1], keep ? i2 : -1) << "token " << t;
    kept += keep;
    expected += std::min(1.0, 2.0 * s2);
  }
  EXPECT_EQ(r.choices, N + kept);
  EXPECT_NEAR(kept, expected, 4 * std::sqrt(expected));  // the keep rate is E[min(1, 2 g2)]
}

// d/dlogits of L = sum dgate * gate + aux_scale * aux_sum + z_scale * z_sum, with the routing held fixed
// (the logits move by less than the margins between choices).
void check_backward(int K, double F, SecondPolicy policy) {
  const int E = 4, N = 12, Ng = 6;
  auto z = testing::randn((size_t)N * E, 5, "z", 2.0f);
  auto dgate = testing::randn((size_t)N * K, 6, "dgate", 1.0f);
  const float aux_scale = 0.3f, z_scale = 0.05f;
  const RouterConfig rc{E, K, F, Ng, policy};
  const RouterDraws draws{9, 1, 0, 0};
  Routing r0;
  route(z.data(), N, rc, draws, r0);
  std::vector<float> dz((size_t)N * E);
  std::vector<float> dg(dgate);
  for (size_t i = 0; i < dg.size(); i++)
    if (r0.slot[i] < 0) dg[i] = 0;  // a dropped choice gets no gradient from the experts
  route_backward(dz.data(), r0, dg.data(), aux_scale, z_scale);
  auto loss = [&]() {
    Routing r;
    route(z.data(), N, rc, draws, r);
    for (size_t i = 0; i < r.expert.size(); i++) {
      EXPECT_EQ(r.expert[i], r0.expert[i]) << "a choice flipped: step too large";
      EXPECT_EQ(r.slot[i], r0.slot[i]);
    }
    // f is a constant of the loss: recompute the aux from r's probabilities with r0's first shares.
    double aux = 0;
    for (int g = 0; g < N / Ng; g++)
      for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = g * Ng; t < (g + 1) * Ng; t++) P += r.probs[t * E + e];
        aux += E * r0.first_share[g * E + e] * P / Ng;
      }
    double L = aux_scale * aux + z_scale * r.z_sum;
    for (size_t i = 0; i < r.gate.size(); i++) L += (double)dg[i] * r.gate[i];
    return L;
  };
  testing::expect_grad("dlogits", z, dz, loss, {}, 1e-2f);
}

TEST(MoeRouter, BackwardMatchesFiniteDifferencesTop1) { check_backward(1, 0.0, SecondPolicy::all); }
TEST(MoeRouter, BackwardMatchesFiniteDifferencesTop2) { check_backward(2, 0.0, SecondPolicy::all); }
TEST(MoeRouter, BackwardMatchesFiniteDifferencesTop2WithDrops) { check_backward(2, 1.0, SecondPolicy::all); }
TEST(MoeRouter, BackwardMatchesFiniteDifferencesTop2Random) { check_backward(2, 0.0, SecondPolicy::random); }

}  // namespace
}  // namespace mt::nn
