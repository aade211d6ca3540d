#include "train/sma.h"

namespace mt::train {

void sma_correct(float* w_new, const float* w, const float* z, float alpha, float* csum, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float c = alpha * (w[i] - z[i]);
    w_new[i] -= c;
    csum[i] += c;
  }
}

void sma_center(float* z, float* z_prev, const float* csum, float mu, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float old = z[i];
    z[i] = old + csum[i] + mu * (old - z_prev[i]);
    z_prev[i] = old;
  }
}

}  // namespace mt::train
