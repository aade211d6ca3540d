#include "train/sync_window_steps.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/sync_window.h"
#include "train/grad_sync.h"
#include "train/window_steps.h"
#include "train/train_config.h"

namespace mt::train {

bool sync_window_applies(const TrainConfig& cfg, const SyncOptions& o, std::string* reason) {
  auto no = [&](const std::string& why) {
    if (reason) *reason = why;
    return false;
  };
  const std::string name = cfg.schedule.empty() ? pipeline::kDefaultSchedule : cfg.schedule;
  if (cfg.pp <= 1 || (name != "1f1b" && name != "zb-h1" && name != "zb-h2"))
    return no("not --schedule 1f1b, zb-h1 or zb-h2 at --pp > 1");
  if (cfg.virtual_stages > 1) return no("--virtual-stages > 1");
  if (cfg.grad_clip > 0)
    return no(str("--grad-clip ", cfg.grad_clip, ": the clip factor needs the global gradient norm before any "
                  "stage updates"));
  if (o.method != SyncMethod::exact || o.grow.enabled)
    return no("an exchange other than the exact one (or --adaptive-batch)");
  if (cfg.zero > 1) return no("--zero 2/3 (the store reduces buckets through the executor's hooks)");
  if (cfg.gpt.moe_every > 0) return no("a mixture-of-experts model (its routing statistics are per step)");
  if (cfg.model != ModelKind::gpt) return no("a model other than gpt");
  if (cfg.optimizer != OptimizerKind::adamw && cfg.optimizer != OptimizerKind::sgd)
    return no("an optimizer other than adamw or sgd");
  if (cfg.delayed_update || cfg.overlap_update) return no("--delayed-update");
  if (cfg.offload.optimizer || cfg.offload.params || cfg.offload.grads || cfg.offload.activations)
    return no("offloaded state");
  return true;
}

namespace {

class SyncWindowSteps : public WindowSteps {
 public:
  SyncWindowSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace, SyncWindowParts parts)
      : WindowSteps(task, pp, trace, parts.share, parts.window_ends_after), parts_(std::move(parts)),
        last_stage_(pp.group->rank() == pp.spec.stages - 1) {
    MT_ASSERT(pp_.spec.virtual_stages == 1 && parts_.share && parts_.window_ends_after && parts_.tie_ready,
              "the back-to-back executor needs one chunk per rank and all its parts");
  }

  void run(int64_t s, const BatchShare& share, const StepHooks&, const StepUpdate& update) override {
    enter(s, share);
    task_.begin_step(s);
    runner_ = task_.stage_runner(s, share, nullptr);  // (before open: the executor asks it the activation size)
    open_at(s);
    run_step(s, 1, [&] {
      UpdatePart part;
      part.outcome_later = true;
      part.window_end = s == last_;
      update(runner_->loss, part);
    });
    leave(s);
  }

 private:
  pipeline::Schedule window_list(int K) const override { return pipeline::sync_window_schedule(pp_.spec, K); }

  // Micro-batch i of the window is micro-batch i mod m of step first_ + i / m, which is the step being run: in a
  // sync window a rank's computations of a step all lie between its updates of the step before and of the step.
  // So one runner, made from the share the loop passes, serves each call.
  int local(int i) const {
    MT_ASSERT(first_ + i / m_ == cur_, "micro-batch ", i, " of step ", first_ + i / m_, " while running step ", cur_);
    return i % m_;
  }
  // The last stage's tied copy is final after its last backward (its input half under zb-h1 / zb-h2).
  void after_input_half(int i) {
    if (last_stage_ && i == m_ - 1) parts_.tie_ready(cur_);
  }
  size_t activation_count() const override { return runner_->activation_count(); }
  const float* forward(int c, int i, const float* input) override { return runner_->forward(c, local(i), input); }
  const float* backward(int c, int i, const float* dout) override {
    const int k = local(i);
    const float* d = runner_->backward(c, k, dout);
    after_input_half(k);
    return d;
  }
  const float* backward_input(int c, int i, const float* dout) override {
    const int k = local(i);
    const float* d = runner_->backward_input(c, k, dout);
    after_input_half(k);
    return d;
  }
  void backward_weight(int c, int i) override { runner_->backward_weight(c, local(i)); }

  SyncWindowParts parts_;
  const bool last_stage_;
  std::unique_ptr<TaskStageRunner> runner_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_sync_window_steps(TrainTask& task, const PipelineContext& pp,
                                                     trace::ChromeTrace* trace, SyncWindowParts parts) {
  return std::make_unique<SyncWindowSteps>(task, pp, trace, std::move(parts));
}

}  // namespace mt::train
