// 1f1b, zb-h1 and zb-h2 in a training run without a barrier between steps (the exact rule, no clipping): the
// step executor that runs the back-to-back window of parallel/pipeline/sync_window.h in pieces, one per call of
// the step loop, so that run_steps (trainer.cpp) stays as it is. Call s runs this rank's actions after U(s-1)
// through U(s): in a sync window those are step s's computations, then the update of step s. What makes it
// back to back is what U(s) waits for: nothing from another pipeline stage but the tied wte's other copy, which
// the last stage sends right after its last input half of the step (the GPT takes that copy's gradient in its
// input half: model/gpt.h) and the first stage when it reaches U(s). The reductions inside a stage (dp, and the
// tp collectives of its computations) stay where they are. The step's loss and gradient norm (and the noise
// scale's sums), which need every stage, are reduced when the window ends, each as the per-step update reduces
// it, so every row holds the same bits; the non-finite stop then fires at the window's end, naming the step (the
// window's later updates ran).
//
// A window ends, with every outcome settled, after each step where the loop evaluates, saves, stops or ends
// (and at least every kMaxWindowSteps steps).
//
//   rank 0:    ... F F I W I W I W  U(t) | F(t+1) ...          U(t) of rank 0: its own gradient, the dp
//   rank p-1:  ... F I F I F I  W W W W  U(t) | F(t+1) ...     reduction, the last stage's wte copy (sent at
//                             ^ wte copy sent                  its last I) -- not rank p-1's deferred W's
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "train/step_executor.h"

namespace mt::train {

struct TrainConfig;
struct SyncOptions;

struct SyncWindowParts {
  std::function<BatchShare(int64_t)> share;        // this rank's share of step s
  std::function<bool(int64_t)> window_ends_after;  // the loop needs the settled state after step s
  std::function<void(int64_t)> tie_ready;          // the last stage: its tied copies' gradients of step s are final
};

// Whether cfg's run takes the back-to-back executor: --schedule 1f1b, zb-h1 or zb-h2 at --pp > 1 with
// --grad-clip 0, the exact exchange (no compression, Local SGD, adaptive batch, delayed or per-micro-batch
// updates), ZeRO 0 or 1, no MoE, the GPT, AdamW or SGD, no offloaded state. Otherwise each step ends with the
// update's reductions over every stage as before; reason says why.
bool sync_window_applies(const TrainConfig& cfg, const SyncOptions& o, std::string* reason = nullptr);

std::unique_ptr<StepExecutor> make_sync_window_steps(TrainTask& task, const PipelineContext& pp,
                                                     trace::ChromeTrace* trace, SyncWindowParts parts);

}  // namespace mt::train
