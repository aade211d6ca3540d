// Mixture-of-experts gating: from router logits to which expert each token goes to, with what gate, in
// which slot of the expert's capacity, and the auxiliary losses. One pure function over buffers (forward)
// and its backward to the logits; no communication, no expert computation (nn/moe.h composes those).
//
// Legend: N tokens (rows), E experts, K choices per token (1: Switch, 2: GShard), Ng tokens per routing group,
// cap the capacity of one expert in one group.
//
// The semantics are the conformance interface of `--moe-*` (README "Mixture of experts"); a layout never
// changes them, because a group is a run of whole windows of the global batch and lives in one micro-batch:
//   p = softmax(logits) in float32.
//   K = 1: choice e1 = argmax p (ties: lower index), gate p[e1].
//   K = 2: e1, e2 the two largest p (ties: lower index), gates g = p[e] / (p[e1] + p[e2]) so g1 + g2 = 1.
//          Second policy `random` keeps e2 only when 2 g2 > u, u uniform from the counter-based generator
//          (seed, stream "moe.second.{step}.{layer}", index = global token index); `all` always keeps it.
//   Capacity per expert and group: cap = ceil(F * K * Ng / E), evaluated in double in that order; F = 0 is
//          dropless (cap = Ng). Admission, per group: every first choice in token order, then every kept second
//          choice in token order; a choice finding its expert full is dropped (gate 0, no gradient through
//          the expert), the token's other choice keeps its gate. A token with nothing admitted passes on
//          through the residual stream only.
//   Load-balancing loss, per group: E * sum_i f_i P_i, f_i = share of the group's tokens whose first choice is
//          i (before capacity), P_i = the group's mean p_i. The layer's aux loss is its mean over all groups of
//          the global batch; f is a constant for the gradient.
//   Router z-loss, per token: logsumexp(logits)^2; the layer's z loss is its mean over the global batch.
// Sums (not means) come out of forward so that micro-batches and ranks add them up; the caller divides by
// the global group and token counts, and hands backward those divisors folded into the coefficients.
//
// Cost: O(N E) for softmax and top-k, O(N K) for admission; nothing allocated per call beyond `out`'s vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt::nn {

enum class SecondPolicy { all, random };

struct RouterConfig {
  int experts = 0;             // E
  int top_k = 1;               // K: 1 or 2
  double capacity_factor = 0;  // F; 0 = dropless
  int group_tokens = 0;        // Ng; N must be a multiple of it
  SecondPolicy second = SecondPolicy::all;
};

// Where the random second-choice draws come from (policy `random`): the counter-based generator keyed by
// (seed, step, layer, global index of the token in row 0 + row).
struct RouterDraws {
  uint64_t seed = 0;
  int64_t step = 0;
  int layer = 0;
  int64_t first_token = 0;
};

// ceil(F * K * Ng / E), or Ng when F = 0 (dropless: a token picks an expert at most once).
int expert_capacity(const RouterConfig& rc);

struct Routing {
  int N = 0, E = 0, K = 0;
  std::vector<float> probs;          // [N, E] softmax of the logits
  std::vector<float> lse;            // [N] logsumexp of the logits
  std::vector<int32_t> expert;       // [N, K] chosen expert; -1: second choice not kept (policy random)
  std::vector<float> gate;           // [N, K] gate of the choice (renormalized over the two for K = 2)
  std::vector<int32_t> slot;         // [N, K] position among the group's admitted tokens of that expert; -1 dropped
  std::vector<int32_t> group_count;  // [groups, E] tokens admitted per expert and group (<= cap)
  std::vector<float> first_share;    // [groups, E] f_i: share of the group's tokens whose first choice is i
  std::vector<int64_t> first_load;   // [E] first choices per expert over all groups (before capacity)
  int64_t choices = 0;               // choices made (kept by the second policy)
  int64_t dropped = 0;               // of those, dropped for capacity
  double aux_sum = 0;                // sum over groups of E * sum_i f_i P_i
  double z_sum = 0;                  // sum over tokens of lse^2

  bool admitted(int t, int k) const { return slot[(size_t)t * K + k] >= 0; }
};

// Forward: logits[N, E] -> out. N must be a multiple of rc.group_tokens (checked).
void route(const float* logits, int N, const RouterConfig& rc, const RouterDraws& draws, Routing& out);

// Backward: dlogits[N, E] (overwritten) from dgate[N, K] = dL/dgate of each choice (0 for a dropped one),
// plus aux_scale * the load-balancing sums and z_scale * the z sums (aux_scale = alpha / groups in the
// global batch, z_scale = beta / tokens in the global batch).
void route_backward(float* dlogits, const Routing& r, const float* dgate, float aux_scale, float z_scale);

}  // namespace mt::nn
