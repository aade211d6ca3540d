#include "optim/optimizer.h"

#include <cmath>

#include "optim/adamw_update.h"

namespace mt::optim {

std::vector<Segment> segments_of(const nn::ParamRegistry& params) {
  std::vector<Segment> segs;
  int i = 0;
  for (const nn::Param& p : params.params())
    segs.push_back({p.offset, p.offset, p.offset, p.numel, p.decay, i++, 0, &p});
  return segs;
}

AdamW::AdamW(size_t n, const AdamWConfig& cfg)
    : cfg_(cfg), m_(state_.declare_flat("adamw.m", n)), v_(state_.declare_flat("adamw.v", n)) {}

void AdamW::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) {
  const double t = (double)step + 1.0;
  const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const float bc1 = (float)(1.0 - std::pow((double)b1, t));
  const float bc2 = (float)(1.0 - std::pow((double)b2, t));
  float* m = state_.data(m_);
  float* v = state_.data(v_);
  const float gs = grad_scale_;
  grad_scale_ = 1.0f;
  for (const Segment& s : segments) {
    const float wd = s.decay ? cfg_.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* g = grads + s.grad;
    float* ms = m + s.state;
    float* vs = v + s.state;
    adamw_update(p, g, ms, vs, s.count, {b1, b2, eps, bc1, bc2, gs, lr, wd});
  }
}

Sgd::Sgd(size_t n, const SgdConfig& cfg) : cfg_(cfg), buf_(state_.declare_flat("sgd.momentum", n)) {}

void Sgd::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr, int64_t step) {
  float* buf = state_.data(buf_);
  const float mu = cfg_.momentum;
  const float gs = grad_scale_;
  grad_scale_ = 1.0f;
  for (const Segment& s : segments) {
    const float wd = s.decay ? cfg_.weight_decay : 0.0f;
    float* p = params + s.param;
    const float* gr = grads + s.grad;
    float* b = buf + s.state;
    if (gs != 1.0f) {
      // Not fused: SGD's update below must stay the exact operations Hogwild's step repeats (the compiler
      // contracts g + wd * p into one FMA there and here), so the scaled gradient is stored first, as a
      // scaling pass over the buffer would store it.
      scaled_.resize(s.count);
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < s.count; i++) scaled_[i] = gr[i] * gs;
      gr = scaled_.data();
    }
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < s.count; i++) {
      float g = gr[i] + wd * p[i];
      b[i] = step == 0 ? g : mu * b[i] + g;
      p[i] -= lr * b[i];
    }
  }
}

float LrSchedule::at(int64_t s) const {
  if (s < warmup) return (float)(lr * (double)(s + 1) / (double)warmup);
  if (s >= total) return (float)min_lr;
  double progress = (double)(s - warmup) / (double)(total - warmup);
  return (float)(min_lr + (lr - min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0);
}

double global_norm(const float* g, size_t n) {
  double sum = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
  for (size_t i = 0; i < n; i++) sum += (double)g[i] * (double)g[i];
  return std::sqrt(sum);
}

float clip_by_global_norm(float* g, size_t n, double norm, double clip) {
  if (clip <= 0) return 1.0f;
  double factor = clip / (norm + 1e-6);
  if (factor >= 1.0) return 1.0f;
  float f = (float)factor;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) g[i] *= f;
  return f;
}

}  // namespace mt::optim
