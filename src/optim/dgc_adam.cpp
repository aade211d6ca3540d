#include "optim/dgc_adam.h"

#include <cmath>

#include "core/error.h"
#include "optim/adamw_update.h"

namespace mt::optim {

DgcAdam::DgcAdam(size_t n, const DgcAdamConfig& cfg)
    : cfg_(cfg), m_(state_.declare_flat("dgc_adam.m", n)), v_(state_.declare_flat("dgc_adam.v", n)) {
  MT_CHECK_INPUT(cfg.freeze_step >= 1, "DGC with AdamW needs --freeze-step K >= 1 (AdamW for the first K steps, "
                 "whose variance is then frozen), got ", cfg.freeze_step);
}

void DgcAdam::preconditioner(float* out, size_t n) {
  const float bc2 = (float)(1.0 - std::pow((double)cfg_.adam.beta2, (double)cfg_.freeze_step));
  const float eps = cfg_.adam.eps;
  const float* v = state_.data(v_);
  for (size_t i = 0; i < n; i++) out[i] = std::sqrt(v[i] / bc2) + eps;
}

void DgcAdam::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
                   int64_t step) {
  const bool fz = frozen(step);
  const double t = (double)step + 1.0;
  const float b1 = cfg_.adam.beta1, b2 = cfg_.adam.beta2, eps = cfg_.adam.eps;
  const float bc1 = (float)(1.0 - std::pow((double)b1, t));
  const float bc2 = (float)(1.0 - std::pow((double)b2, t));
  float* m = state_.data(m_);
  float* v = state_.data(v_);
  const float gs = fz ? 1.0f : grad_scale_;
  const float lrs = cfg_.lr_scale * lr;  // the step's rate after the freeze
  grad_scale_ = 1.0f;
  for (const Segment& s : segments) {
    const float wd = s.decay ? cfg_.adam.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* g = grads + s.grad;
    float* ms = m + s.state;
    float* vs = v + s.state;
    if (!fz) {
      adamw_update(p, g, ms, vs, s.count, {b1, b2, eps, bc1, bc2, gs, lr, wd});
    } else {
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < s.count; i++) p[i] -= lrs * (g[i] + wd * p[i]);
    }
  }
}

}  // namespace mt::optim
