#include "parallel/async/hogwild.h"

#include <atomic>

namespace mt::parallel {

void hogwild_read(const float* shared, float* local, size_t n) {
  float* s = const_cast<float*>(shared);  // atomic_ref needs a non-const object; this only loads
  for (size_t i = 0; i < n; i++) local[i] = std::atomic_ref<float>(s[i]).load(std::memory_order_relaxed);
}

void hogwild_sgd_step(float* shared, const float* grads, float* momentum, const std::vector<optim::Segment>& segs,
                      const optim::SgdConfig& cfg, float lr, int64_t step) {
  const float mu = cfg.momentum;
  for (const optim::Segment& sg : segs) {
    const float wd = sg.decay ? cfg.weight_decay : 0.0f;
    float* p = shared + sg.param;
    const float* gr = grads + sg.grad;
    float* b = momentum + sg.state;
    for (size_t i = 0; i < sg.count; i++) {
      std::atomic_ref<float> pi(p[i]);
      const float pv = pi.load(std::memory_order_relaxed);
      const float g = gr[i] + wd * pv;
      b[i] = step == 0 ? g : mu * b[i] + g;
      pi.store(pv - lr * b[i], std::memory_order_relaxed);
    }
  }
}

}  // namespace mt::parallel
