// The parameter store's part of an optimizer step on one rank, for optimizer unit tests: the statistics
// rounds (optim/optimizer.h) over the given pieces, then the update. Pieces may cut a tensor anywhere; the
// sums of a tensor's pieces add up as DataParallel::tensor_sums adds them (with nothing to reduce).
#pragma once

#include <memory>
#include <vector>

#include "nn/params.h"
#include "optim/optimizer.h"

namespace mt::test {

inline void step_with_stats(optim::Optimizer& opt, const nn::ParamRegistry& reg, const std::vector<optim::Segment>& segs,
                            float* p, const float* g, float lr, int64_t step) {
  const auto& all = reg.params();
  for (int round = 0; round < opt.stat_rounds(); round++) {
    optim::TensorSums ts;
    ts.first.assign(all.size() + 1, 0);
    for (size_t t = 0; t < all.size(); t++) ts.first[t + 1] = ts.first[t] + opt.stat_count(round, all[t]);
    ts.sums.assign(ts.first.back(), 0.0);
    const optim::PieceSums fn = opt.piece_sums(round, step);
    for (const optim::Segment& s : segs)
      if (ts.count(s.tensor) > 0) fn(s, p + s.param, g + s.grad, &ts.sums[ts.first[s.tensor]]);
    opt.set_tensor_sums(round, std::move(ts));
  }
  opt.step(p, g, segs, lr, step);
}

// The pieces of registry `reg` with tensor t cut at the local offsets in cuts[t] (ascending, inside it).
inline std::vector<optim::Segment> cut_pieces(const nn::ParamRegistry& reg, const std::vector<std::vector<size_t>>& cuts) {
  std::vector<optim::Segment> out;
  int t = 0;
  for (const nn::Param& p : reg.params()) {
    std::vector<size_t> at = {0};
    if ((size_t)t < cuts.size()) at.insert(at.end(), cuts[t].begin(), cuts[t].end());
    at.push_back(p.numel);
    for (size_t k = 0; k + 1 < at.size(); k++)
      out.push_back({p.offset + at[k], p.offset + at[k], p.offset + at[k], at[k + 1] - at[k], p.decay, t, at[k], &p});
    t++;
  }
  return out;
}

}  // namespace mt::test

namespace mt::test {

// An optimizer stepped with scale_next_grads(f) on g and a twin stepped on g * f (float32 products) move the
// parameters identically, statistics rounds included; then both step on plain g (the scale lasts one step).
// Returns the first element that differs, or -1.
template <class MakeOpt>
int fused_scale_mismatch(const nn::ParamRegistry& reg, MakeOpt make) {
  const size_t n = reg.size();
  std::vector<float> p1(n), g(n), gf(n);
  const float f = 0.3712f;
  for (size_t i = 0; i < n; i++) {
    p1[i] = 0.01f * (float)((int)(i * 37 % 101) - 50);
    g[i] = 0.003f * (float)((int)(i * 53 % 89) - 44);
    gf[i] = g[i] * f;
  }
  std::vector<float> p2 = p1;
  auto fused = make(), plain = make();
  const auto segs = optim::segments_of(reg);
  fused->scale_next_grads(f);
  step_with_stats(*fused, reg, segs, p1.data(), g.data(), 0.01f, 0);
  step_with_stats(*plain, reg, segs, p2.data(), gf.data(), 0.01f, 0);
  for (size_t i = 0; i < n; i++)
    if (p1[i] != p2[i]) return (int)i;
  step_with_stats(*fused, reg, segs, p1.data(), g.data(), 0.01f, 1);
  step_with_stats(*plain, reg, segs, p2.data(), g.data(), 0.01f, 1);
  for (size_t i = 0; i < n; i++)
    if (p1[i] != p2[i]) return (int)(n + i);
  return -1;
}

}  // namespace mt::test
