// --learners L: Crossbow's synchronous model averaging as a gradient exchange (the rule: sma.h). Each rank
// keeps L learner replicas of the model (weights, and their own copy of the optimizer's state) and the
// central average model z; k = L x dp learners in all.
//
//   step s, rank r:  micro-batches i = 0 .. m-1 (m % L == 0): learner j = i L / m computes on its m / L
//                    micro-batches at its own weights (the hooks swap w_j into the registry before its first
//                    micro-batch and keep the gradient of the one before)
//   update:          per learner j: its gradient is the mean over its own windows (the accumulated gradient
//                    of the global-batch mean, times L x dp); clipped by its own norm (--grad-clip); the
//                    run's optimizer steps w_j with learner j's state; then the SMA correction
//                    (sma_correct); sum_j c_j all-reduced over dp (one float32 all-reduce of the model per
//                    step, no gradient exchange); z updated (sma_center) identically on every rank
//   between steps:   the registry holds z (what evaluation, checkpoints and --save see)
//
// The step's row: loss = the global batch's mean loss, each window at its learner's weights; norm = the root
// mean square of the k learners' gradient norms (one scalar all-reduce). Memory: per rank L copies of the
// weights, L of the gradient, L of the optimizer state, plus z, z_prev and the correction sum.
// Checkpoints keep z (the model) and, as the exchange's per-rank state (exchange_state.h), every learner's
// weights and optimizer buffers and z_prev: a resume under the same ranks, L, alpha and mu continues the unbroken
// run bit for bit. Under another layout (or from a checkpoint without them) the learners and z_prev restart from
// z, each with the checkpoint's optimizer state (the buffers the optimizer held after the last learner's update),
// and the lead warns.
#pragma once

#include <memory>

#include "train/grad_sync.h"

namespace mt::train {

std::unique_ptr<GradSync> make_sma_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                        parallel::DataParallel& store, nn::ParamRegistry& params,
                                        trace::ChromeTrace* tracer);

// --learners' own checks (the micro-batch count per rank m must be a multiple of L; alpha and mu in range);
// the combinations it refuses are in train_config.cpp's kRefused. d: the data-parallel degree.
void check_learners(const TrainConfig& c, int d);

}  // namespace mt::train
