// The step executor: runs this rank's share of one optimizer step's forward and backward, either as a plain
// micro-batch loop (gradients accumulate over the micro-batches, the synchronizer's hooks around each) or as
// the pipeline executor running this rank's action list of the schedule (parallel/pipeline). Chosen once
// when the run starts; the step loops call run() whatever the layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/data/param_versions.h"
#include "parallel/pipeline/executor.h"
#include "trace/chrome_trace.h"
#include "train/layout.h"
#include "train/task.h"
#include "train/update_part.h"

namespace mt::train {

struct PresummedStep;  // train/grad_sync.h

// The update of a step, the same part whatever the executor: called once this rank's forward and backward
// work of the step is done (after the last micro-batch, or at the schedule's optimizer_step action) with the
// loss sum this rank computed (under a pipeline, only the last stage's rank has one).
using StepUpdate = std::function<void(double loss_sum, UpdatePart part)>;

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Forward and backward of this rank's share of step s, and its update (called exactly once).
  virtual void run(int64_t s, const BatchShare& share, const StepHooks& hooks, const StepUpdate& update) = 0;
  // Whether run() calls the hooks it is given (the micro-batch loop does; the pipeline executor when it was
  // made to, else it runs the schedule without them and the exchange reduces the whole gradient after it).
  virtual bool calls_hooks() const = 0;
  // Pipeline runs: the executor's accumulated timings on this rank (null otherwise).
  virtual pipeline::PipelineStats* stats() { return nullptr; }
  // The store's weight versions (null: none), for a pipeline whose schedule updates after every micro-batch:
  // its forwards and backwards tell the versions which micro-batch they compute (train/weight_stash.h).
  virtual void set_versions(parallel::ParamVersions*) {}
};

// pp null or of one stage: the micro-batch loop; else the schedule of pp->spec over pp->group. trace (may be
// null) records the pipeline's computations and messages. schedule_hooks: the pipeline executor calls the
// hooks (StepHooks::accumulate before the list, params inside every forward and backward of it), for a
// parameter store that needs them (parallel::needs_hooks: ZeRO 2 and 3).
std::unique_ptr<StepExecutor> make_step_executor(TrainTask& task, const PipelineContext* pp, trace::ChromeTrace* trace,
                                                 bool schedule_hooks = false);

}  // namespace mt::train
