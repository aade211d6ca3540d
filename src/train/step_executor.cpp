#include "train/step_executor.h"

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"
#include "train/weight_stash.h"

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
    update(loss, {});
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
      : task_(task), pp_(pp), trace_(trace), hooks_(hooks),
        micro_updates_(pipeline::find_schedule(pp.spec.name).micro_updates() !=
                       pipeline::ScheduleGenerator::MicroUpdates::none) {
    // The updates' order on each rank is its backwards' order, ascending (the k-th update is micro-batch k's).
    int k = 0;
    for (const pipeline::Action& a : pp.schedule[pp.group->rank()])
      if (a.kind == pipeline::ActionKind::optimizer_step && a.micro_batch >= 0)
        MT_ASSERT(a.micro_batch == k++, "per-micro-batch updates out of order in schedule ", pp.spec.name);
  }
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
    // Schedules that update after every micro-batch: the versions see each forward and backward, and each
    // update gets its micro-batch's loss (the last stage's; 0 elsewhere).
    std::unique_ptr<pipeline::StageRunner> versioned;
    if (versions_ && micro_updates_) versioned = std::make_unique<VersionedRunner>(*runner, *versions_);
    int updates = 0;
    double loss_before = 0;
    executor_.run(pp_.spec, pp_.schedule, *pp_.group, versioned ? *versioned : *runner, &stats_, trace_, [&] {
      const int i = updates++;
      if (!micro_updates_) return update(runner->loss, {});
      update(runner->loss - loss_before, {i, pp_.spec.micro_batches});
      loss_before = runner->loss;
    });
    MT_ASSERT(updates == (micro_updates_ ? pp_.spec.micro_batches : 1), "pipeline schedule ", pp_.spec.name, " ran ",
              updates, " optimizer steps in one step");
  }
  void set_versions(parallel::ParamVersions* v) override { versions_ = v; }
  bool calls_hooks() const override { return hooks_; }
  pipeline::PipelineStats* stats() override { return &stats_; }

 private:
  TrainTask& task_;
  PipelineContext pp_;
  pipeline::PipelineExecutor executor_;
  pipeline::PipelineStats stats_;
  trace::ChromeTrace* trace_;
  bool hooks_;
  bool micro_updates_;  // the schedule updates after every micro-batch (pipedream, pipemare)
  parallel::ParamVersions* versions_ = nullptr;
};

}  // namespace

std::unique_ptr<StepExecutor> make_step_executor(TrainTask& task, const PipelineContext* pp, trace::ChromeTrace* trace,
                                                 bool schedule_hooks) {
  if (pp && pp->group && pp->spec.stages > 1) return std::make_unique<PipelineSteps>(task, *pp, trace, schedule_hooks);
  return std::make_unique<MicroBatchLoop>(task);
}

}  // namespace mt::train
