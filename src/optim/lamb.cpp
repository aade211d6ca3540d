#include "optim/lamb.h"

#include <cmath>

#include "core/error.h"

namespace mt::optim {

namespace {

// The step's constants: bias corrections of t = step + 1, and the gradient scale pending (clipping).
struct LambStep {
  float b1, b2, eps, bc1, bc2, gs;
};

LambStep lamb_step(const LambConfig& c, int64_t step, float gs) {
  const double t = (double)step + 1.0;
  return {c.beta1, c.beta2, c.eps, (float)(1.0 - std::pow((double)c.beta1, t)),
          (float)(1.0 - std::pow((double)c.beta2, t)), gs};
}

// The new moments of one element and its r (the same float32 operations wherever called, so the statistics
// round and the update agree bit for bit).
inline float lamb_r(const LambStep& k, float g, float w, float wd, float m, float v, float& m2, float& v2) {
  const float gi = __builtin_assoc_barrier(g * k.gs);  // rounded as a scaling pass would round it
  m2 = k.b1 * m + (1.0f - k.b1) * gi;
  v2 = k.b2 * v + (1.0f - k.b2) * gi * gi;
  return (m2 / k.bc1) / (std::sqrt(v2 / k.bc2) + k.eps) + wd * w;
}

}  // namespace

Lamb::Lamb(size_t n, const LambConfig& cfg)
    : cfg_(cfg), m_(state_.declare_flat("lamb.m", n)), v_(state_.declare_flat("lamb.v", n)) {}

double Lamb::trust_ratio(double w_norm, double r_norm) {
  return w_norm == 0.0 || r_norm == 0.0 ? 1.0 : w_norm / r_norm;
}

PieceSums Lamb::piece_sums(int round, int64_t step) {
  MT_ASSERT(round == 0, "LAMB has one statistics round, asked for round ", round);
  const LambStep k = lamb_step(cfg_, step, grad_scale_);
  const float* m = state_.data(m_);
  const float* v = state_.data(v_);
  const float wd_all = cfg_.weight_decay;
  return [k, m, v, wd_all](const Segment& s, const float* p, const float* g, double* out) {
    const float wd = s.decay ? wd_all : 0.0f;
    const float* ms = m + s.state;
    const float* vs = v + s.state;
    double ww = 0, rr = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : ww, rr)
    for (size_t i = 0; i < s.count; i++) {
      float m2, v2;
      const float r = lamb_r(k, g[i], p[i], wd, ms[i], vs[i], m2, v2);
      ww += (double)p[i] * p[i];
      rr += (double)r * r;
    }
    out[0] += ww;
    out[1] += rr;
  };
}

void Lamb::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) {
  const LambStep k = lamb_step(cfg_, step, grad_scale_);
  grad_scale_ = 1.0f;
  float* m = state_.data(m_);
  float* v = state_.data(v_);
  for (const Segment& s : segments) {
    MT_ASSERT(s.tensor >= 0 && (size_t)s.tensor + 1 < tensor_sums_.first.size() && tensor_sums_.count(s.tensor) == 2,
              "LAMB stepped a piece of tensor ", s.tensor, " without its statistics round");
    const double* sums = tensor_sums_.of(s.tensor);
    const float trust = (float)trust_ratio(std::sqrt(sums[0]), std::sqrt(sums[1]));
    const float wd = s.decay ? cfg_.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* g = grads + s.grad;
    float* ms = m + s.state;
    float* vs = v + s.state;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < s.count; i++) {
      float m2, v2;
      const float r = lamb_r(k, g[i], p[i], wd, ms[i], vs[i], m2, v2);
      ms[i] = m2;
      vs[i] = v2;
      p[i] -= lr * trust * r;
    }
  }
}

}  // namespace mt::optim
