// LAMB (You et al., "Large Batch Optimization for Deep Learning", 2020) over the store's pieces. Per tensor,
// t = step + 1:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2                          (flat state "lamb.m", "lamb.v")
//   r = m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd w                 (wd only on tensors of >= 2 dims)
//   trust = |w| / |r| over the whole tensor (1 when either norm is 0);    w -= lr trust r
// The norms are whole-tensor whatever the layout: one statistics round (optimizer.h) of two sums per tensor,
// sum w^2 and sum r^2, added over the pieces a rank owns and reduced over the groups that split the tensor
// (ZeRO's dp, tp). The round computes r from m and v as step() will update them without storing them, and
// step() computes it again by the same float32 operations (lamb_r below), so the r whose norm is taken is the
// r applied. Cost: one more pass over p, g, m, v per step than AdamW, and 2 floats per tensor reduced.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim {

struct LambConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0.0f;
};

class Lamb : public Optimizer {
 public:
  Lamb(size_t n, const LambConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;

  int stat_rounds() const override { return 1; }
  size_t stat_count(int, const nn::Param&) const override { return 2; }  // sum w^2, sum r^2
  PieceSums piece_sums(int round, int64_t step) override;

  // |w| / |r|, and 1 when either is 0.
  static double trust_ratio(double w_norm, double r_norm);

 private:
  LambConfig cfg_;
  size_t m_, v_;
};

}  // namespace mt::optim
