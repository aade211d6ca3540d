#include "train/noise_scale.h"

namespace mt::train {

NoiseEstimate estimate_noise(const NoiseSample& s) {
  NoiseEstimate e;
  if (!(s.b_big > s.b_small && s.b_small > 0)) return e;
  e.g2 = (s.b_big * s.big_sq - s.b_small * s.small_sq) / (s.b_big - s.b_small);
  e.trace = (s.small_sq - s.big_sq) / (1.0 / s.b_small - 1.0 / s.b_big);
  e.valid = true;
  return e;
}

void NoiseScale::add(const NoiseSample& sample) {
  last_ = estimate_noise(sample);
  if (!last_.valid) return;
  s_ = a_ * s_ + (1 - a_) * last_.trace;
  g_ = a_ * g_ + (1 - a_) * last_.g2;
}

}  // namespace mt::train
