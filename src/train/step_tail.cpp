#include "train/step_tail.h"

#include <cmath>

#include "core/error.h"
#include "train/divergence_guard.h"

namespace mt::train {

void NonFiniteCheck::check(int64_t s, double loss, double norm) {
  if (std::isfinite(loss) && std::isfinite(norm)) return;
  const std::string advice = advice_ ? advice_(s) : std::string();
  throw DivergedError(str(!std::isfinite(loss) ? "loss" : "gradient norm", " is ", !std::isfinite(loss) ? loss : norm,
                          " at ", where_ ? where_(s) : "step " + std::to_string(s + 1), "; training stopped", advice,
                          " (try a lower --lr or --grad-clip)"));
}

SpikeCheck::SpikeCheck(double factor, int window, Text advice)
    : guard_(std::make_unique<DivergenceGuard>(factor, window)), advice_(std::move(advice)) {}
SpikeCheck::~SpikeCheck() = default;

void SpikeCheck::check(int64_t s, double loss, double norm) {
  if (!guard_->enabled() || !std::isfinite(loss)) return;
  if (auto v = guard_->observe(s + 1, loss))
    throw DivergedError(str(v->message, "; training stopped", advice_ ? advice_(v->first_step - 1) : std::string(),
                            " (try a lower --lr)"));
}

void StepTail::check(int64_t s, double loss, double norm) const {
  for (const auto& c : checks_) c->check(s, loss, norm);
}

float StepTail::clip_factor(double norm) const {
  return clip_ > 0 && norm + 1e-6 > clip_ ? (float)(clip_ / (norm + 1e-6)) : 1.0f;
}

float StepTail::finish(int64_t s, double loss, double norm, const std::function<void(float)>& scale) const {
  check(s, loss, norm);
  if (clip_ > 0 && norm + 1e-6 > clip_) scale(clip_factor(norm));
  return lr(s);
}

}  // namespace mt::train
