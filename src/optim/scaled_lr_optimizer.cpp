#include "optim/scaled_lr_optimizer.h"

#include <map>

#include "core/error.h"

namespace mt::optim {

ScaledLrOptimizer::ScaledLrOptimizer(std::unique_ptr<Optimizer> inner, Factor factor)
    : inner_(std::move(inner)), factor_(std::move(factor)) {
  MT_ASSERT(inner_ && inner_->stat_rounds() == 0, "a per-segment learning rate over an optimizer with a "
            "whole-tensor statistics phase");
}

void ScaledLrOptimizer::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
                             int64_t step) {
  const float gs = grad_scale_;
  grad_scale_ = 1.0f;
  // Segments by factor, each group in the order given (a group's call sees its segments as one call would).
  std::map<double, std::vector<size_t>> groups;
  for (size_t k = 0; k < segments.size(); k++) groups[factor_(segments[k], step)].push_back(k);
  for (const auto& [f, idx] : groups) {
    group_.clear();
    for (size_t k : idx) group_.push_back(segments[k]);
    inner_->scale_next_grads(gs);
    inner_->step(params, grads, group_, (float)((double)lr * f), step);
  }
}

}  // namespace mt::optim
