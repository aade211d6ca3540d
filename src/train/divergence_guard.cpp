// Divergence guard: running median of recent losses, a factor and a window (see the header).
#include "train/divergence_guard.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace mt::train {

std::optional<DivergenceVerdict> DivergenceGuard::observe(int64_t step, double loss) {
  if (!enabled()) return std::nullopt;
  // The first loss (the model as initialized, about ln V for a language model) is the first reference; a run
  // that blows up at once is judged against it.
  if (good_.empty()) {
    good_.push_back(loss);
    return std::nullopt;
  }
  std::vector<double> v(good_.begin(), good_.end());
  auto mid = v.begin() + (std::ptrdiff_t)(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  // The lowest running median so far: a loss that creeps up over tens of steps drags its own median along,
  // so the reference only ever goes down.
  best_median_ = std::min(best_median_, *mid);
  const double median = best_median_;
  const bool high = loss > factor_ * median && loss > median + kMargin;
  if (!high) {
    high_run_ = 0;
    good_.push_back(loss);
    if ((int)good_.size() > kHistory) good_.pop_front();
    return std::nullopt;
  }
  if (high_run_++ == 0) first_high_ = step;
  if (high_run_ < window_) return std::nullopt;
  return DivergenceVerdict{first_high_, step, loss, median,
                           str("loss is ", loss, " at step ", step, ", above ", factor_, " x its running median ",
                               "(lowest so far) ", median, " for ", window_, " steps (since step ", first_high_,
                               "; --divergence-factor, --divergence-window)")};
}

}  // namespace mt::train
