#include "parallel/compress/dgc.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::compress {

double dgc_density(double target, int64_t warmup, int64_t s) {
  if (warmup <= 0 || s >= warmup) return target;
  const int64_t stage = (4 * s) / warmup;  // 0..3
  return std::max(target, std::pow(0.25, (double)(stage + 1)));
}

float dgc_clip_factor(double share_norm, double thr, int nranks) {
  if (thr <= 0) return 1.0f;
  const double local = thr / std::sqrt((double)nranks);
  const double f = local / (share_norm + 1e-6);
  return f >= 1.0 ? 1.0f : (float)f;
}

DgcMomentum::DgcMomentum(const std::vector<size_t>& sizes, float momentum) : m_(momentum) {
  u_.reserve(sizes.size());
  for (size_t n : sizes) u_.emplace_back(n, 0.0f);
}

void DgcMomentum::correct(size_t t, float* x, size_t n) {
  MT_ASSERT(t < u_.size() && u_[t].size() == n, "DgcMomentum::correct: tensor ", t, " of ", n, " elements");
  float* u = u_[t].data();
  for (size_t i = 0; i < n; i++) {
    u[i] = m_ * u[i] + x[i];
    x[i] = u[i];
  }
}

void DgcMomentum::mask(size_t t, const std::vector<uint32_t>& sent) {
  std::vector<float>& u = u_[t];
  for (uint32_t i : sent) {
    MT_ASSERT(i < u.size(), "DgcMomentum::mask: index ", i, " of ", u.size());
    u[i] = 0.0f;
  }
}

}  // namespace mt::compress
