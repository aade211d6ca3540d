#include "train/pipemare.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/scaled_lr_optimizer.h"

namespace mt::train {

double pipemare_lr_factor(int p, int j, bool tied, int64_t n, int64_t K) {
  MT_ASSERT(p >= 1 && j >= 0 && j < p && K > 0, "pipemare learning-rate factor of stage ", j, " of ", p, ", K ", K);
  const double tau = tied ? p : p - j;
  const double power = 1.0 - std::min((double)n / (double)K, 1.0);
  return std::pow(tau, -power);
}

std::unique_ptr<optim::Optimizer> pipemare_lr_schedule(std::unique_ptr<optim::Optimizer> opt, int p, int j,
                                                       int64_t K) {
  return std::make_unique<optim::ScaledLrOptimizer>(
      std::move(opt), [p, j, K](const optim::Segment& s, int64_t n) {
        return pipemare_lr_factor(p, j, s.param_of && s.param_of->replicas.in(nn::CopyGroup::tie), n, K);
      });
}

}  // namespace mt::train

namespace mt::train {

PipeMareVersions::PipeMareVersions(int m, double gamma) : m_(m), gamma_((float)gamma), fwd_((size_t)m, -1) {
  MT_ASSERT(m >= 1 && gamma >= 0 && gamma < 1, "pipemare correction with m ", m, ", decay ", gamma);
}

void PipeMareVersions::bind(float* resident, size_t n) {
  MT_ASSERT(resident || n == 0, "no resident parameters to correct");
  a_ = resident;
  n_ = n;
  delta_.resize(n);
  newest_copy_.resize(n);
  before_.resize(n);
  std::fill(delta_.data(), delta_.data() + n, 0.0f);
}

void PipeMareVersions::restore() {
  if (!predicted_) return;
  if (n_) std::memcpy(a_, newest_copy_.data(), n_ * sizeof(float));
  predicted_ = false;
}

void PipeMareVersions::before_forward() {
  if (windowed_) return;  // the window's steps do not flush: begin_window numbers the versions
  MT_ASSERT(!predicted_, "a prediction resident between steps");
  std::fill(fwd_.begin(), fwd_.end(), -1);
  newest_ = 0;
}

void PipeMareVersions::begin_window(const pipeline::Schedule&, int n) {
  MT_ASSERT(n >= 1 && !predicted_, "a window of ", n, " micro-batches (or a prediction resident between windows)");
  windowed_ = true;
  m_ = n;
  fwd_.assign((size_t)n, -1);
  newest_ = 0;
}

void PipeMareVersions::before_micro_forward(int i) {
  MT_ASSERT(i >= 0 && i < m_ && fwd_[i] < 0, "forward of micro-batch ", i, " twice or out of range");
  restore();
  fwd_[i] = newest_;
}

void PipeMareVersions::before_micro_backward(int i) {
  MT_ASSERT(i >= 0 && i < m_ && fwd_[i] >= 0, "backward of micro-batch ", i, " before its forward");
  restore();
  const int d = newest_ - fwd_[i];
  if (d == 0) return;
  std::memcpy(newest_copy_.data(), a_, n_ * sizeof(float));
  const float fd = (float)d;
  const float* dl = delta_.data();
  for (size_t k = 0; k < n_; k++) a_[k] -= fd * dl[k];
  predicted_ = true;
}

void PipeMareVersions::before_update() {
  restore();
  if (n_) std::memcpy(before_.data(), a_, n_ * sizeof(float));
}

void PipeMareVersions::after_update() {
  const float g = gamma_, h = 1.0f - gamma_;
  float* dl = delta_.data();
  const float* b = before_.data();
  for (size_t k = 0; k < n_; k++) dl[k] = g * dl[k] + h * (a_[k] - b[k]);
  newest_++;
}

}  // namespace mt::train
