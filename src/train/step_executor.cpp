#include "train/step_executor.h"

#include "core/error.h"

namespace mt::train {

namespace {

// m micro-batches in order, each forward then backward; the gradient accumulates in the registry.
class MicroBatchLoop : public StepExecutor {
 public:
  explicit MicroBatchLoop(TrainTask& task) : task_(task) {}
  void run(int64_t s, const BatchShare& share, const StepHooks& hooks, const StepUpdate& update) override {
    task_.begin_step(s);
    double loss = 0.0;
    for (int i = 0; i < share.micro_count(); i++) {
      if (hooks.micro_batch) hooks.micro_batch(i, share.micro_count());
      loss += task_.micro_batch(s, share.micro_first(i), share.micro_len(i), hooks.params);
    }
    update(loss);
  }
  bool calls_hooks() const override { return true; }

 private:
  TrainTask& task_;
};

// This rank's action list of the run's schedule, run by the pipeline executor over the task's chunks; the
// update runs at the list's optimizer_step action. Without hooks the gradients are reduced whole by the
// update (the synchronizer's reduce). With them (ZeRO 2, 3) the store sees every group's use in every
// forward and backward of the list; the backward passes of the step's m micro-batches interleave with
// forwards of others, so the store counts m backward visits per group before it reduces the group's bucket
// (StepHooks::accumulate), and ZeRO 3 gathers a group around each visit.
class PipelineSteps : public StepExecutor {
 public:
  PipelineSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace, bool hooks)
      : task_(task), pp_(pp), trace_(trace), hooks_(hooks) {}
  void run(int64_t s, const BatchShare& share, const StepHooks& hooks, const StepUpdate& update) override {
    MT_ASSERT(share.micro_count() == pp_.spec.micro_batches, "a share of ", share.micro_count(),
              " micro-batches for a schedule of ", pp_.spec.micro_batches);
    // Messages between stages have one shape per schedule: every micro-batch of the share is whole.
    for (int i = 0; i < share.micro_count(); i++)
      MT_ASSERT(share.micro_len(i) == share.micro_size(), "pipeline micro-batch ", i, " of ", share.micro_len(i),
                " windows in a share of micro-batches of ", share.micro_size());
    task_.begin_step(s);
    if (hooks_ && hooks.accumulate) hooks.accumulate(share.micro_count());
    std::unique_ptr<TaskStageRunner> runner = task_.stage_runner(s, share, hooks_ ? hooks.params : nullptr);
    int updates = 0;
    executor_.run(pp_.spec, pp_.schedule, *pp_.group, *runner, &stats_, trace_, [&] {
      updates++;
      update(runner->loss);
    });
    MT_ASSERT(updates == 1, "pipeline schedule ", pp_.spec.name, " ran ", updates, " optimizer steps in one step");
  }
  bool calls_hooks() const override { return hooks_; }
  pipeline::PipelineStats* stats() override { return &stats_; }

 private:
  TrainTask& task_;
  PipelineContext pp_;
  pipeline::PipelineExecutor executor_;
  pipeline::PipelineStats stats_;
  trace::ChromeTrace* trace_;
  bool hooks_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_step_executor(TrainTask& task, const PipelineContext* pp, trace::ChromeTrace* trace,
                                                 bool schedule_hooks) {
  if (pp && pp->group && pp->spec.stages > 1) return std::make_unique<PipelineSteps>(task, *pp, trace, schedule_hooks);
  return std::make_unique<MicroBatchLoop>(task);
}

}  // namespace mt::train
