#include "train/step_executor.h"

#include "core/error.h"

namespace mt::train {

namespace {

// m micro-batches in order, each forward then backward; the gradient accumulates in the registry.
class MicroBatchLoop : public StepExecutor {
 public:
  explicit MicroBatchLoop(TrainTask& task) : task_(task) {}
  double run(int64_t s, const BatchShare& share, const StepHooks& hooks) override {
    task_.begin_step(s);
    double loss = 0.0;
    for (int i = 0; i < share.micro_count; i++) {
      if (hooks.micro_batch) hooks.micro_batch(i, share.micro_count);
      loss += task_.micro_batch(s, share.micro_first(i), share.micro_len(i), hooks.params);
    }
    return loss;
  }

 private:
  TrainTask& task_;
};

// This rank's action list of the schedule (built once), run by the pipeline executor over the task's chunks.
// The gradients are reduced after the list (the synchronizer's reduce), so no hooks run inside it.
class PipelineSteps : public StepExecutor {
 public:
  PipelineSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace)
      : task_(task), pp_(pp), list_(pipeline::make_schedule(pp.spec)[pp.group->rank()]), trace_(trace) {}
  double run(int64_t s, const BatchShare& share, const StepHooks&) override {
    MT_ASSERT(share.micro_count == pp_.spec.micro_batches, "a share of ", share.micro_count,
              " micro-batches for a schedule of ", pp_.spec.micro_batches);
    task_.begin_step(s);
    std::unique_ptr<TaskStageRunner> runner = task_.stage_runner(s, share);
    executor_.run(pp_.spec, list_, *pp_.group, *runner, &stats_, trace_);
    return runner->loss;
  }
  pipeline::PipelineStats* stats() override { return &stats_; }

 private:
  TrainTask& task_;
  PipelineContext pp_;
  std::vector<pipeline::Action> list_;
  pipeline::PipelineExecutor executor_;
  pipeline::PipelineStats stats_;
  trace::ChromeTrace* trace_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_step_executor(TrainTask& task, const PipelineContext* pp,
                                                 trace::ChromeTrace* trace) {
  if (pp && pp->group && pp->spec.stages > 1) return std::make_unique<PipelineSteps>(task, *pp, trace);
  return std::make_unique<MicroBatchLoop>(task);
}

}  // namespace mt::train
