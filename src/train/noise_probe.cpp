#include "train/noise_probe.h"

#include <algorithm>

namespace mt::train {

NoiseProbe::NoiseProbe(nn::ParamRegistry& params, Mode mode)
    : params_(params), mode_(mode), groups_(params.num_groups()), backwards_(params.num_groups(), 0) {
  for (const nn::Param& p : params.params()) {
    if (!p.replicas.counted) continue;
    if (p.replicas.summed && (mode == Mode::last || mode == Mode::whole))  // pipelines: read after their sum
      summed_.push_back(&p);
    else
      groups_[p.group].push_back(&p);
  }
}

void NoiseProbe::begin_micro_batch(int i, int n) {
  i_ = i;
  n_ = n;
  if (i == 0) {
    sum_ = 0;
    if (mode_ == Mode::delta && n > 1) prev_.assign(params_.size(), 0.0f);
  }
}

void NoiseProbe::begin_accumulation(int m) {
  n_ = m;
  sum_ = 0;
  std::fill(backwards_.begin(), backwards_.end(), 0);
}

double NoiseProbe::group_sq(int g) const {
  double sq = 0;
  for (const nn::Param* p : groups_[g])
    for (size_t k = 0; k < p->numel; k++) sq += (double)p->grad[k] * p->grad[k];
  return sq;
}

void NoiseProbe::add_whole() {
  sum_ = 0;
  for (int g = 0; g < (int)groups_.size(); g++) sum_ += group_sq(g);
}

void NoiseProbe::add_tensors_summed() {
  for (const nn::Param* p : summed_)
    for (size_t k = 0; k < p->numel; k++) sum_ += (double)p->grad[k] * p->grad[k];
}

void NoiseProbe::after_backward(int g) {
  switch (mode_) {
    case Mode::delta:
      if (n_ > 1) {
        const bool keep = i_ < n_ - 1;  // the next micro-batch needs this one's sum
        double sq = 0;
        for (const nn::Param* p : groups_[g]) {
          const float* grad = p->grad;
          float* prev = prev_.data() + p->offset;
          for (size_t k = 0; k < p->numel; k++) {
            const double c = (double)grad[k] - (double)prev[k];
            sq += c * c;
            if (keep) prev[k] = grad[k];
          }
        }
        sum_ += sq;
      } else {
        sum_ += group_sq(g);
      }
      break;
    case Mode::fresh:
      sum_ += group_sq(g);
      break;
    case Mode::last:
      if (++backwards_[g] == n_) sum_ += group_sq(g);
      break;
    case Mode::whole:
      break;
  }
  inner_->after_backward(g);
}

}  // namespace mt::train
