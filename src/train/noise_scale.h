// The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"): the batch
// size B_simple = tr(Sigma) / |G|^2 beyond which a bigger batch stops paying, with G the true gradient and
// Sigma the per-example gradient covariance. Estimated from two batch sizes at once, with no communication of
// its own: the small batches (one micro-batch of one rank, of B_small examples) and the big batch (the step's
// global batch, B_big examples), whose gradients' squared norms are unbiased for
//   E|g_B|^2 = |G|^2 + tr(Sigma) / B,
// which gives the unbiased estimators
//   |G|^2     = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
//   tr(Sigma) = (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)
// where |g_small|^2 is the mean over the step's small batches of each one's mean-gradient squared norm. B counts
// the run's items (tokens for the GPT, examples for the MLP), so B_simple is in those units. One
// step's ratio is very noisy (|G|^2 can even come out negative), so the logged value is the ratio of the two
// estimators' exponential moving averages (as the paper does): with decay a (0.95 by default) and
// bias correction after t steps,
//   S_t = a S_{t-1} + (1 - a) tr(Sigma)_t,   G_t = a G_{t-1} + (1 - a) |G|^2_t,   B_simple = S_t / G_t
// (the (1 - a^t) corrections cancel in the ratio). A step with B_big == B_small (one small batch) has no
// estimate and leaves the averages as they are.
#pragma once

#include <cstdint>

namespace mt::train {

// One step's measurements.
struct NoiseSample {
  double small_sq = 0;  // mean over the small batches of |g_small|^2
  double big_sq = 0;    // |g_big|^2
  double b_small = 0, b_big = 0;
};

// The two unbiased estimators of one step.
struct NoiseEstimate {
  double g2 = 0;     // |G|^2
  double trace = 0;  // tr(Sigma)
  bool valid = false;
};
NoiseEstimate estimate_noise(const NoiseSample& s);

class NoiseScale {
 public:
  explicit NoiseScale(double decay = 0.95) : a_(decay) {}
  void add(const NoiseSample& s);
  // The last step's single-step estimators and the moving-average B_simple (0 before the first estimate or
  // while the averaged |G|^2 is not positive).
  const NoiseEstimate& last() const { return last_; }
  double b_simple() const { return g_ > 0 ? s_ / g_ : 0.0; }
  double g2() const { return g_; }
  double trace() const { return s_; }

 private:
  double a_;
  double s_ = 0, g_ = 0;  // unnormalized moving averages (bias corrections cancel in the ratio)
  NoiseEstimate last_;
};

}  // namespace mt::train
