// 1-bit Adam (Tang et al. 2021), the optimizer's half: exact AdamW during the warm-up, then the variance frozen
// and the momentum taken from the compressed exchange (parallel/compress/onebit.h), which mixes each rank's
// gradient into the last synchronized momentum and sends it as signs with a scale.
//
// With K = --freeze-step, b1, b2, eps, wd as for AdamW and t = step + 1:
//   step < K   AdamW exactly (the same operations as optim::AdamW, bit-equal):
//                m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
//   step >= K  the gradient buffer holds the new synchronized momentum M (the exchange's output, the same on
//              every data-parallel rank); v stays as it was after step K-1 and so does its bias correction:
//                m = M;  p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^K)) + eps) + wd p)
//              the clipping factor (scale_next_grads) is the exchange's to apply to the gradient before it is
//              mixed in; here it is ignored.
// State: "onebit_adam.m", "onebit_adam.v" (flat, as AdamW's).
#pragma once

#include <cstdint>
#include <utility>

#include "optim/optimizer.h"

namespace mt::optim {

struct OnebitAdamConfig {
  AdamWConfig adam;
  int64_t freeze_step = 0;  // K: steps 0..K-1 are AdamW
};

class OnebitAdam : public Optimizer {
 public:
  OnebitAdam(size_t n, const OnebitAdamConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;
  bool compressing(int64_t step) const { return step >= cfg_.freeze_step; }
  float beta1() const { return cfg_.adam.beta1; }
  // The synchronized momentum m (flat, indexed like the gradients).
  const float* momentum() { return state_.data(m_); }
  // The clipping factor set for the next step, reset to 1: the exchange applies it to the gradient it mixes
  // into the momentum (after the freeze step).
  float take_grad_scale() { return std::exchange(grad_scale_, 1.0f); }

 private:
  OnebitAdamConfig cfg_;
  size_t m_, v_;
};

}  // namespace mt::optim
