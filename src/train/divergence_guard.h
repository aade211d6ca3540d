// Divergence guard: stops a run whose loss is finite but has blown up (AdamW at lr 1e3 ends at 2e7 with
// exit 0 otherwise). The reference is the running median of the last kHistory not-high losses, taken at its
// lowest so far (a loss creeping up over many steps would otherwise drag its median along and never look
// high). A step is "high" when its loss exceeds both `factor` x the reference and the reference + 1 (an
// absolute margin in nats, so a loss of 1e-5 wobbling to 2e-4 near convergence is not divergence); `window`
// high steps in a row are divergence. The median tolerates single spikes and lucky batches, the window
// transient blow-ups. Cost per step: a copy and nth_element of <= 100 doubles, nothing
// next to a training step. Pure (no I/O): the trainer turns a verdict into its stop-and-name-the-checkpoint
// path shared with non-finite losses.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace mt::train {

struct DivergenceVerdict {
  int64_t first_step;   // the first high step of the run of `window` (numbered as the caller numbers steps)
  int64_t step;         // the step that completed the run
  double loss, median;  // that step's loss and the median it was compared with
  std::string message;  // "loss is 2.1e+07 at step 12, above 10 x its running median 4.15 for 5 steps (since step 8)"
};

class DivergenceGuard {
 public:
  static constexpr int kHistory = 100;
  static constexpr double kMargin = 1.0;
  // factor 0 turns the guard off; otherwise factor > 1 and window >= 1 (TrainConfig::validate checks).
  DivergenceGuard(double factor, int window) : factor_(factor), window_(window) {}
  // Feeds one step's finite loss; returns a verdict once `window` high steps ran in a row.
  std::optional<DivergenceVerdict> observe(int64_t step, double loss);
  bool enabled() const { return factor_ > 0; }

 private:
  double factor_;
  int window_;
  std::deque<double> good_;  // the last kHistory not-high losses
  double best_median_ = 1e300;
  int high_run_ = 0;
  int64_t first_high_ = -1;
};

}  // namespace mt::train
