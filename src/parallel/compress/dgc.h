// Deep Gradient Compression (Lin et al. 2018) for the top-k exchange: the parts that turn top-k with error
// feedback into DGC. The exchange (exchange.h) calls them around its codec; this file holds only the rules.
//
// Per rank r and tensor, with g the rank's share of the step's gradient (shares sum to the exact gradient over
// the N data-parallel ranks), m the momentum, thr the clipping threshold:
//
//   local clipping          g *= min(1, (thr / sqrt(N)) / (|g| + 1e-6)), |g| over this rank's whole share of
//                           the replica (all its tensors; the tp parts of one replica summed, copies counted
//                           once), before anything is accumulated. thr <= 0: no clipping.
//   momentum correction     u = m u + g;  v = v + u           (u: velocity, v: accumulated velocity)
//   top-k of v              payload = the k(s) entries of largest |v| (codec.h's topk, ties to the lower index)
//   momentum factor masking where an entry was sent: v = 0 and u = 0
//   update                  the sum over ranks of the payloads is the step's gradient; the optimizer must then
//                           apply no momentum of its own (SGD runs with momentum 0: w -= lr (sum + wd w)).
//
//   sparsity warm-up        the kept fraction of step s, target R (--compress topk:R) and W warm-up steps in
//                           four equal stages j = floor(4 s / W) (s < W): max(R, 0.25^(j + 1)), i.e. 25%,
//                           6.25%, 1.5625%, 0.390625% (the paper's 75%, 93.75%, 98.4375%, 99.6% sparsity, one
//                           stage per epoch there, a quarter of W steps here); R from step W on (and always when
//                           W = 0).
//
// With AdamW the momentum lives in Adam's first moment, so DGC runs with m = 0: u = g, v accumulates the
// clipped gradients that were not sent (plain error feedback), masking clears v where sent, and AdamW sees the
// exchanged sparse sum as its gradient (its moments are the optimizer's, untouched by the exchange).
//
// State (u per tensor) is this rank's; checkpoints keep it with the error-feedback residuals, per rank
// (train/exchange_state.h: a resume under the same layout continues it, any other starts it at zero).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt::compress {

struct DgcOptions {
  bool enabled = false;
  float momentum = 0.0f;  // m (0: no momentum correction, the AdamW case)
  double clip = 0.0;      // thr of the whole gradient; each rank clips its share at thr / sqrt(N); <= 0: off
  int64_t warmup = 0;     // W: steps of sparsity warm-up
};

// The fraction of entries kept at step s (the rule above).
double dgc_density(double target, int64_t warmup, int64_t s);

// The factor a rank multiplies its share by: min(1, thr / sqrt(N) / (norm + 1e-6)); 1 when thr <= 0.
float dgc_clip_factor(double share_norm, double thr, int nranks);

// The velocities u of one rank's tensors.
class DgcMomentum {
 public:
  DgcMomentum() = default;
  // sizes: elements per tensor.
  DgcMomentum(const std::vector<size_t>& sizes, float momentum);
  // x[0, n) holds tensor t's (clipped) gradient g; afterwards u = m u + g and x = u.
  void correct(size_t t, float* x, size_t n);
  // Momentum factor masking: u = 0 at the sent indices.
  void mask(size_t t, const std::vector<uint32_t>& sent);
  const std::vector<float>& velocity(size_t t) const { return u_[t]; }
  std::vector<float>& velocity(size_t t) { return u_[t]; }
  size_t tensors() const { return u_.size(); }

 private:
  float m_ = 0.0f;
  std::vector<std::vector<float>> u_;
};

}  // namespace mt::compress
