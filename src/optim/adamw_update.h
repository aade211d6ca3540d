// AdamW's elementwise update of one stretch of parameters: the one loop that AdamW, 1-bit Adam (before its
// freeze step) and DGC with AdamW (before its freeze step) run, so that the three agree bit for bit.
#pragma once

#include <cmath>
#include <cstddef>

namespace mt::optim {

// The step's constants: moments' rates b1, b2, eps, the bias corrections bc1 = 1 - b1^t and bc2 = 1 - b2^t, the
// gradient scale gs (global-norm clipping; 1 when none), the learning rate and this stretch's weight decay.
struct AdamWStep {
  float b1, b2, eps, bc1, bc2, gs, lr, wd;
};

// One pass: reads p, g, m, v and writes p, m, v (28 bytes per parameter); vectorized (sqrt and divide are exact
// in SIMD as in scalar form, so results equal the scalar loop's).
inline void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k) {
  const float b1 = k.b1, b2 = k.b2, eps = k.eps, bc1 = k.bc1, bc2 = k.bc2, gs = k.gs, lr = k.lr, wd = k.wd;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float gi = __builtin_assoc_barrier(g[i] * gs);  // rounded as a scaling pass would round it
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] / bc1;
    float vhat = v[i] / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

}  // namespace mt::optim
