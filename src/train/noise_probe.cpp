#include "train/noise_probe.h"

#include <algorithm>

namespace mt::train {

NoiseProbe::NoiseProbe(nn::ParamRegistry& params) : params_(params), groups_(params.num_groups()) {
  for (const nn::Param& p : params.params())
    if (p.replicas.counted) groups_[p.group].push_back(&p);
}

void NoiseProbe::begin_micro_batch(int i, int n) {
  i_ = i;
  n_ = n;
  if (i == 0) {
    sum_ = 0;
    if (n > 1) prev_.assign(params_.size(), 0.0f);
  }
}

void NoiseProbe::after_backward(int g) {
  const bool keep = n_ > 1 && i_ < n_ - 1;  // the next micro-batch needs this one's sum
  double sq = 0;
  for (const nn::Param* p : groups_[g]) {
    const float* grad = p->grad;
    if (n_ > 1) {
      float* prev = prev_.data() + p->offset;
      for (size_t k = 0; k < p->numel; k++) {
        const double c = (double)grad[k] - (double)prev[k];
        sq += c * c;
        if (keep) prev[k] = grad[k];
      }
    } else {
      for (size_t k = 0; k < p->numel; k++) sq += (double)grad[k] * grad[k];
    }
  }
  sum_ += sq;
  inner_->after_backward(g);
}

}  // namespace mt::train
