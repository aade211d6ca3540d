// PipeDream-2BW without a flush in a training run: the step executor that runs the window of
// parallel/pipeline/no_flush.h in pieces, one per call of the step loop, so that run_steps (trainer.cpp) stays
// as it is. Call s runs this rank's actions after U(s-1) through U(s): step s's remaining backwards, step s+1's
// forwards (and those of its backwards that come before U(s)), then the update of step s (the loop's update,
// unchanged). A window ends, with every update done, after each step where the loop evaluates, saves, stops or
// ends (and every kMaxWindowSteps steps), so checkpoints and --resume see the flushed run's state.
//
// Per computation the part binds a micro-batch to its step: the step's stage runner (made from that step's share
// of the batch), the weight version it reads (step t reads W(t-1): the delay-1 versions' buffers are swapped while
// step t+1's computations run), and the gradient it adds to (step t+1's backwards before U(t) go to the registry
// after g_t has been moved aside; at U(t) g_t is put back for the exchange and step t+1's partial gradient waits
// beside it until the next call, after the loop's begin_step). The arithmetic of every micro-batch and the order
// in which gradients add up are the flushed run's, so the run equals it to float32 rounding. Where the exchange
// can be split (train/split_exchange.h: the exact exchange at ZeRO 0), step t's reductions start after this
// rank's last backward of t on a copy of g_t (the registry starts from zero for step t+1) and U(t) finishes them
// and updates; elsewhere the updates are the exchange's blocking collectives (each costs a forward fill,
// (p - 1) F: plan/window_sim.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "nn/params.h"
#include "train/split_exchange.h"
#include "train/step_executor.h"
#include "train/window_steps.h"

namespace mt::train {

struct TrainConfig;

struct NoFlushParts {
  std::function<BatchShare(int64_t)> share;          // this rank's share of step s
  std::function<bool(int64_t)> window_ends_after;    // the loop needs the flushed state after step s
  std::function<void()> swap_versions;               // swaps the two weight versions (and refreshes what reads them)
  nn::ParamRegistry* params = nullptr;               // the registry whose flat gradient the backwards add to
  // Null: the update runs the blocking exchange inside U(t). Else it makes (once, at the first step: the store
  // exists by then) the split exchange (train/split_exchange.h): step t's reductions start after this rank's last
  // backward of t and finish at U(t), whose update then gets them presummed.
  std::function<std::unique_ptr<SplitExchange>()> split;
};

// Whether cfg's run takes the no-flush executor: --schedule pipedream-2bw at pp > 1 with one chunk per rank,
// at least p micro-batches per step (the steps' activation keys then never meet), no MoE, ZeRO 0 or 1 (with
// --precision bf16, swap_versions remakes the bf16 mirror of the version swapped in), and under the MPI backend
// only where the exchange is split (train/split_exchange.h). Otherwise the run flushes between steps (the same
// rule, 1F1B's bubble); reason says why.
bool no_flush_applies(const TrainConfig& cfg, int micro_batches, std::string* reason = nullptr);

std::unique_ptr<StepExecutor> make_no_flush_steps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace,
                                                  NoFlushParts parts);

}  // namespace mt::train
