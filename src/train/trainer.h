// The training loop: gradient of the global batch, global-norm clipping, LR schedule, optimizer step,
// metrics, evaluation, checkpoints, resume. Thin by design: the model and data live in a TrainTask.
#pragma once

#include "train/train_config.h"

namespace mt::train {

struct TrainSummary {
  int64_t steps_run = 0;
  double final_loss = 0;
  double items_per_s = 0;  // mean over the steps run, excluding the first (warm-up)
  double flops_per_step = 0;
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
};

// Runs training as configured. Throws mt::Error subclasses on bad input or divergence.
TrainSummary run_training(const TrainConfig& cfg);

}  // namespace mt::train
