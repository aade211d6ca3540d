#include "optim/onebit_adam.h"

#include <cmath>

#include "optim/adamw_update.h"

namespace mt::optim {

OnebitAdam::OnebitAdam(size_t n, const OnebitAdamConfig& cfg)
    : cfg_(cfg), m_(state_.declare_flat("onebit_adam.m", n)), v_(state_.declare_flat("onebit_adam.v", n)) {}

void OnebitAdam::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
                      int64_t step) {
  const bool frozen = compressing(step);
  const double t = (double)step + 1.0;
  const float b1 = cfg_.adam.beta1, b2 = cfg_.adam.beta2, eps = cfg_.adam.eps;
  const float bc1 = (float)(1.0 - std::pow((double)b1, t));
  const float bc2 = (float)(1.0 - std::pow((double)b2, frozen ? (double)cfg_.freeze_step : t));
  float* m = state_.data(m_);
  float* v = state_.data(v_);
  const float gs = frozen ? 1.0f : grad_scale_;
  grad_scale_ = 1.0f;
  for (const Segment& s : segments) {
    const float wd = s.decay ? cfg_.adam.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* g = grads + s.grad;
    float* ms = m + s.state;
    float* vs = v + s.state;
    if (!frozen) {
      adamw_update(p, g, ms, vs, s.count, {b1, b2, eps, bc1, bc2, gs, lr, wd});
    } else {
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < s.count; i++) {
        ms[i] = g[i];
        float mhat = ms[i] / bc1;
        float vhat = vs[i] / bc2;
        p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
      }
    }
  }
}

}  // namespace mt::optim
