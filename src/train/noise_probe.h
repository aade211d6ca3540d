// Measures what the gradient noise scale (noise_scale.h) needs during exact data parallelism, between the
// model and the parameter store's hooks: each micro-batch of each rank is a small batch, the step's global
// batch the big one. As group g's backward of micro-batch i ends (after_backward, before the store may start
// reducing g's bucket), this rank's contribution c_i of the micro-batch to g's gradient is the gradient now
// minus the gradient before the micro-batch (a copy of the buffer is kept when there are several
// micro-batches); |c_i|^2 adds up over groups and micro-batches. At the update, with the step's M = dp x n
// micro-batches of B / M items each (an even split of the global batch's windows; otherwise nothing is
// logged) and c = (1/M) gbar for each small batch's mean gradient
// gbar:
//   |g_small|^2 = M^2 (sum over ranks and micro-batches of |c|^2) / M,  B_small = B / M
//   |g_big|^2   = the step's gradient norm squared (the reduced gradient, before clipping), B_big = B
// so dp = 1 with 4 micro-batches and dp = 4 with 1 see the same small batches. Tensors every tp rank holds count
// once (nn::Replicas::counted) and the sum is taken over dp and the replica's other parts: one scalar
// all-reduce per step, the only communication. Valid for the micro-batch loop with ZeRO 0 and 1 (2 and 3 move
// gradients into bucket buffers as they finish), without expert parallelism (--ep > 1: a micro-batch's expert
// gradients are computed on other ranks) and with an even split of the batch; elsewhere nothing is measured.
#pragma once

#include <vector>

#include "nn/param_hooks.h"
#include "nn/params.h"

namespace mt::train {

class NoiseProbe : public nn::ParamHooks {
 public:
  explicit NoiseProbe(nn::ParamRegistry& params);
  void set_inner(nn::ParamHooks* inner) { inner_ = inner; }
  // Before micro-batch i of n of a step.
  void begin_micro_batch(int i, int n);
  // sum over this rank's micro-batches of |c_i|^2 (counted tensors), and their count n.
  double local_sum() const { return sum_; }
  int micro_batches() const { return n_; }

  void before_forward(int g) override { inner_->before_forward(g); }
  void after_forward(int g) override { inner_->after_forward(g); }
  void before_backward(int g) override { inner_->before_backward(g); }
  void after_backward(int g) override;

 private:
  nn::ParamRegistry& params_;
  nn::ParamHooks none_;
  nn::ParamHooks* inner_ = &none_;
  std::vector<std::vector<const nn::Param*>> groups_;  // counted tensors per group
  std::vector<float> prev_;                            // the gradient before this micro-batch (n > 1)
  double sum_ = 0;
  int i_ = 0, n_ = 1;
};

}  // namespace mt::train
