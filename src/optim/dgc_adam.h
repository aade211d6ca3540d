// DGC for AdamW, the optimizer's half (docs/parallelism.md "DGC with AdamW"; the exchange's half, which keeps
// each rank's momentum and accumulated update, is parallel/compress/dgc_adam.h). With K = --freeze-step, b1,
// b2, eps, wd as for AdamW and t = step + 1:
//   step < K   AdamW exactly (the same operations as optim::AdamW, bit-equal):
//                m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
//   step >= K  v is frozen as it was after step K-1 (and so is its bias correction 1-b2^K): the exchange
//              reads the preconditioner D = sqrt(v / (1-b2^K)) + eps (preconditioner()) and hands back, in the
//              gradient buffer, U: the sum over ranks of the sparse preconditioned updates they sent; then
//                p -= lr (U + wd p)      (with --dgc-lr-scale S: lr replaced by S lr, S lr rounded to float32)
//              m is no longer updated (the momentum lives in the exchange, per rank); the clipping factor
//              (scale_next_grads) is the exchange's to apply to the rank's share (take_grad_scale).
// State: "dgc_adam.m", "dgc_adam.v" (flat, as AdamW's).
#pragma once

#include <cstdint>
#include <utility>

#include "optim/optimizer.h"

namespace mt::optim {

struct DgcAdamConfig {
  AdamWConfig adam;
  int64_t freeze_step = 0;  // K: steps 0..K-1 are AdamW
  float lr_scale = 1.0f;    // --dgc-lr-scale S: from K on p -= (S lr) (U + wd p)
};

class DgcAdam : public Optimizer {
 public:
  DgcAdam(size_t n, const DgcAdamConfig& cfg);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) override;
  bool frozen(int64_t step) const { return step >= cfg_.freeze_step; }
  float beta1() const { return cfg_.adam.beta1; }
  // AdamW's first moment m (flat; after step K-1 the exchange starts its momenta from it).
  const float* momentum() { return state_.data(m_); }
  // D = sqrt(v / (1-b2^K)) + eps, element i of the flat buffer, [0, n) (float32, as the update computes it).
  void preconditioner(float* out, size_t n);
  float take_grad_scale() { return std::exchange(grad_scale_, 1.0f); }

 private:
  DgcAdamConfig cfg_;
  size_t m_, v_;
};

}  // namespace mt::optim
