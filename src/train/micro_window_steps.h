// PipeDream and PipeMare without a flush in a training run: the step executor that runs the window of
// parallel/pipeline/micro_window.h in pieces, one per call of the step loop, so that run_steps (trainer.cpp)
// stays as it is. Call s runs this rank's actions after U(s m - 1) through U(s m + m - 1) (window numbering):
// step s's remaining backwards and updates, and the forwards of step s+1 that 1F1B's order puts before them;
// each update is the loop's update of one micro-batch (UpdatePart {k, m}), with the loss of that micro-batch.
// A window ends, with every backward and update done, after each step where the loop evaluates, saves, stops or
// ends (and every kMaxWindowSteps steps), so checkpoints and --resume see one weight version.
//
// Per computation the part binds window micro-batch n = t m + k to its step first + t: the stage runner made from
// that step's share of the batch (micro-batch k of it), and the weight version (the run's MicroVersions part,
// told the window's micro-batch number: the stash of pipedream, PipeMare's versions). The gradient needs no
// binding: the registry holds one micro-batch's gradient at a time (every backward is followed by its update
// before the rank's next backward).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/step_executor.h"

namespace mt::train {

struct TrainConfig;

struct MicroWindowParts {
  std::function<BatchShare(int64_t)> share;        // this rank's share of step s
  std::function<bool(int64_t)> window_ends_after;  // the loop needs the flushed state after step s
};

// Whether cfg's run takes this executor: --schedule pipedream or pipemare at pp > 1 (one chunk per rank), with at
// least p micro-batches per step (two steps' micro-batches in flight then never share an activation key), a gpt
// model. Otherwise the run flushes between steps (the one-step list); reason says why.
bool micro_window_applies(const TrainConfig& cfg, int micro_batches, std::string* reason = nullptr);

// The bubble the simulator gives a window of K steps of this run's spec with its per-micro-batch updates as
// blocking collectives over the stages (plan/window_sim.h simulate_micro_window), at the run's measured per-stage
// forward and backward times and message latency (ms); K = the run's steps, at most kMaxWindowSteps (the
// measured bubble covers every window of the run: the two agree when the run is one window).
double micro_window_simulated_bubble(const pipeline::ScheduleSpec& spec, int64_t steps,
                                     const std::vector<double>& stage_forward,
                                     const std::vector<double>& stage_backward, double message_ms);

std::unique_ptr<StepExecutor> make_micro_window_steps(TrainTask& task, const PipelineContext& pp,
                                                      trace::ChromeTrace* trace, MicroWindowParts parts);

}  // namespace mt::train
