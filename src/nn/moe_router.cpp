#include "nn/moe_router.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/rng.h"

namespace mt::nn {

int expert_capacity(const RouterConfig& rc) {
  if (rc.capacity_factor == 0) return rc.group_tokens;
  const double c = std::ceil(rc.capacity_factor * rc.top_k * rc.group_tokens / rc.experts);
  return (int)std::min<double>(c, rc.group_tokens);  // more slots than tokens changes nothing
}

namespace {

// The two largest entries of p[E] (ties: lower index); i2 = -1 when E = 1.
void top2(const float* p, int E, int& i1, int& i2) {
  i1 = 0;
  for (int e = 1; e < E; e++)
    if (p[e] > p[i1]) i1 = e;
  i2 = -1;
  for (int e = 0; e < E; e++)
    if (e != i1 && (i2 < 0 || p[e] > p[i2])) i2 = e;
}

}  // namespace

void route(const float* logits, int N, const RouterConfig& rc, const RouterDraws& draws, Routing& r) {
  const int E = rc.experts, K = rc.top_k, Ng = rc.group_tokens;
  MT_ASSERT(E >= 1 && (K == 1 || K == 2) && K <= E && Ng >= 1 && N % Ng == 0, "bad router config E=", E, " K=", K,
            " Ng=", Ng, " N=", N);
  const int groups = N / Ng, cap = expert_capacity(rc);
  r.N = N, r.E = E, r.K = K;
  r.probs.resize((size_t)N * E);
  r.lse.resize(N);
  r.expert.assign((size_t)N * K, -1);
  r.gate.assign((size_t)N * K, 0.0f);
  r.slot.assign((size_t)N * K, -1);
  r.group_count.assign((size_t)groups * E, 0);
  r.first_share.assign((size_t)groups * E, 0.0f);
  r.first_load.assign(E, 0);
  r.choices = r.dropped = 0;
  r.aux_sum = r.z_sum = 0;

  for (int t = 0; t < N; t++) {
    const float* z = logits + (size_t)t * E;
    float* p = &r.probs[(size_t)t * E];
    float mx = z[0];
    for (int e = 1; e < E; e++) mx = std::max(mx, z[e]);
    float sum = 0;
    for (int e = 0; e < E; e++) sum += (p[e] = std::exp(z[e] - mx));
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; e++) p[e] *= inv;
    r.lse[t] = mx + std::log(sum);
    r.z_sum += (double)r.lse[t] * r.lse[t];
    int i1, i2;
    top2(p, E, i1, i2);
    int32_t* ex = &r.expert[(size_t)t * K];
    float* g = &r.gate[(size_t)t * K];
    ex[0] = i1;
    if (K == 1) {
      g[0] = p[i1];
    } else {
      const float s = p[i1] + p[i2];
      g[0] = p[i1] / s;
      g[1] = p[i2] / s;
      ex[1] = i2;
      if (rc.second == SecondPolicy::random) {
        const CounterRng rng(draws.seed, "moe.second." + std::to_string(draws.step) + "." + std::to_string(draws.layer));
        if (!(2.0 * g[1] > rng.uniform((uint64_t)(draws.first_token + t)))) {
          ex[1] = -1;
          g[1] = 0;
        }
      }
    }
  }

  // Admission per group: all first choices in token order, then all kept second choices.
  for (int gi = 0; gi < groups; gi++) {
    int32_t* count = &r.group_count[(size_t)gi * E];
    for (int k = 0; k < K; k++) {
      for (int t = gi * Ng; t < (gi + 1) * Ng; t++) {
        const int e = r.expert[(size_t)t * K + k];
        if (e < 0) continue;
        r.choices++;
        if (count[e] < cap) {
          r.slot[(size_t)t * K + k] = count[e]++;
        } else {
          r.dropped++;
          r.gate[(size_t)t * K + k] = 0;
        }
      }
    }
    // Load balancing: E * sum_i f_i P_i over this group.
    float* f = &r.first_share[(size_t)gi * E];
    std::vector<double> P(E, 0.0);
    for (int t = gi * Ng; t < (gi + 1) * Ng; t++) {
      const int e1 = r.expert[(size_t)t * K];
      f[e1] += 1.0f;
      r.first_load[e1]++;
      for (int e = 0; e < E; e++) P[e] += r.probs[(size_t)t * E + e];
    }
    double aux = 0;
    for (int e = 0; e < E; e++) {
      f[e] /= (float)Ng;
      aux += (double)f[e] * (P[e] / Ng);
    }
    r.aux_sum += E * aux;
  }
}

void route_backward(float* dlogits, const Routing& r, const float* dgate, float aux_scale, float z_scale) {
  const int N = r.N, E = r.E, K = r.K;
  const int Ng = N / (int)(r.first_share.size() / E);
  std::vector<float> dp(E);
  for (int t = 0; t < N; t++) {
    const float* p = &r.probs[(size_t)t * E];
    const int32_t* ex = &r.expert[(size_t)t * K];
    const float* dg = dgate + (size_t)t * K;
    // Load balancing: d/dp_i of aux_scale * E * sum_i f_i mean_t(p_ti) = aux_scale * E * f_i / Ng.
    const float* f = &r.first_share[(size_t)(t / Ng) * E];
    for (int e = 0; e < E; e++) dp[e] = aux_scale * (float)E * f[e] / (float)Ng;
    if (K == 1) {
      dp[ex[0]] += dg[0];
    } else {
      // g1 = p1 / S, g2 = p2 / S (S = p1 + p2): dg1/dp1 = p2/S^2, dg1/dp2 = -p1/S^2, and mirrored for g2.
      // A dropped or unkept second choice has dgate 0 but still shapes g1 through S.
      int e2 = ex[1];
      if (e2 < 0) {  // not kept by the random policy: the renormalization still used the runner-up
        int i1, i2;
        top2(p, E, i1, i2);
        e2 = i2;
      }
      const float p1 = p[ex[0]], p2 = p[e2], S = p1 + p2, inv2 = 1.0f / (S * S);
      dp[ex[0]] += (dg[0] - dg[1]) * p2 * inv2;
      dp[e2] += (dg[1] - dg[0]) * p1 * inv2;
    }
    // Softmax: dz_j = p_j (dp_j - sum_k p_k dp_k); z-loss: d(lse^2)/dz_j = 2 lse p_j.
    double dot = 0;
    for (int e = 0; e < E; e++) dot += (double)p[e] * dp[e];
    const float zt = z_scale * 2.0f * r.lse[t];
    float* dz = dlogits + (size_t)t * E;
    for (int e = 0; e < E; e++) dz[e] = p[e] * (dp[e] - (float)dot + zt);
  }
}

}  // namespace mt::nn
