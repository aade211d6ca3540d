#include "train/micro_window_steps.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "parallel/pipeline/micro_window.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule_generator.h"
#include "plan/window_sim.h"
#include "train/window_steps.h"
#include "train/train_config.h"
#include "train/weight_stash.h"

namespace mt::train {

bool micro_window_applies(const TrainConfig& cfg, int micro_batches, std::string* reason) {
  auto no = [&](const std::string& why) {
    if (reason) *reason = why;
    return false;
  };
  if (cfg.pp <= 1 || cfg.schedule.empty() ||
      pipeline::find_schedule(cfg.schedule).micro_updates() == pipeline::ScheduleGenerator::MicroUpdates::none)
    return no("not --schedule pipedream or pipemare at --pp > 1");
  if (cfg.virtual_stages > 1) return no("more than one chunk per rank");
  if (micro_batches < cfg.pp)
    return no(str(micro_batches, " micro-batches per step, fewer than --pp ", cfg.pp,
                  " (two steps' micro-batches in flight would share activation keys)"));
  if (cfg.model != ModelKind::gpt) return no("a model other than gpt");
  return true;
}

double micro_window_simulated_bubble(const pipeline::ScheduleSpec& spec, int64_t steps,
                                     const std::vector<double>& stage_forward,
                                     const std::vector<double>& stage_backward, double message_ms) {
  const int K = (int)std::clamp<int64_t>(steps, 1, kMaxWindowSteps);
  plan::CostModel cost;
  cost.stage_forward = stage_forward;
  cost.stage_backward = stage_backward;
  cost.comm = message_ms;
  return plan::simulate_micro_window(spec, K, pipeline::micro_window_schedule(spec, K), cost).bubble_fraction;
}

namespace {

class MicroWindowSteps : public WindowSteps {
 public:
  MicroWindowSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace, MicroWindowParts parts)
      : WindowSteps(task, pp, trace, parts.share, parts.window_ends_after), parts_(std::move(parts)) {
    MT_ASSERT(pp_.spec.virtual_stages == 1 && parts_.share && parts_.window_ends_after,
              "the no-flush executor of per-micro-batch updates needs one chunk per rank and all its parts");
  }

  void set_versions(parallel::ParamVersions* v) override {
    versions_ = dynamic_cast<MicroVersions*>(v);
    MT_ASSERT(versions_, "per-micro-batch updates without a flush need the run's MicroVersions part");
  }

  void run(int64_t s, const BatchShare& share, const StepHooks&, const StepUpdate& update) override {
    MT_ASSERT(versions_, "per-micro-batch updates without weight versions");
    enter(s, share);
    for (int i = 0; i < share.micro_count(); i++)
      MT_ASSERT(share.micro_len(i) == share.micro_size(), "pipeline micro-batch ", i, " of ", share.micro_len(i),
                " windows in a share of micro-batches of ", share.micro_size());
    open_at(s);
    task_.begin_step(s);
    const int t = (int)(s - first_);
    run_step(s, m_, [&] {
      const int n = next_update_++;  // updates run in backward order (check_micro_window)
      MT_ASSERT(n / m_ == t, "the update of window micro-batch ", n, " while running step ", s);
      TaskStageRunner& r = runner(t);
      double& before = loss_before_[t];
      update(r.loss - before, {n % m_, m_});
      before = r.loss;
    });
    drop_runner(t);
    loss_before_.erase(t);
    if (leave(s)) MT_ASSERT(runners_empty(), "a window ended with work of a later step");
  }

 private:
  pipeline::Schedule window_list(int K) const override {
    pipeline::Schedule window = pipeline::micro_window_schedule(pp_.spec, K);
    pipeline::check_micro_window(pp_.spec, K, window);
    return window;
  }
  // A step ends at the update of its last micro-batch.
  bool ends_step(const pipeline::Action& a) const override { return a.micro_batch % m_ == m_ - 1; }
  void opened(int K, const pipeline::Schedule& window) override {
    loss_before_.clear();
    next_update_ = 0;
    versions_->begin_window(window, K * m_);
  }

  // Window micro-batch n belongs to step first_ + n / m: this call's step or (a forward run ahead) the next.
  int step_of(int n) const {
    const int t = n / m_;
    MT_ASSERT(first_ + t == cur_ || first_ + t == cur_ + 1, "micro-batch ", n, " of step ", first_ + t,
              " while running step ", cur_);
    return t;
  }
  const float* forward(int c, int n, const float* input) override {
    const int t = step_of(n);
    versions_->before_micro_forward(n);
    return runner(t).forward(c, n % m_, input);
  }
  const float* backward(int c, int n, const float* dout) override {
    const int t = step_of(n);
    versions_->before_micro_backward(n);
    return runner(t).backward(c, n % m_, dout);
  }

  MicroWindowParts parts_;
  MicroVersions* versions_ = nullptr;
  std::map<int, double> loss_before_;  // [t]: the loss of step t's runner at its last update
  int next_update_ = 0;
};

}  // namespace

std::unique_ptr<StepExecutor> make_micro_window_steps(TrainTask& task, const PipelineContext& pp,
                                                      trace::ChromeTrace* trace, MicroWindowParts parts) {
  return std::make_unique<MicroWindowSteps>(task, pp, trace, std::move(parts));
}

}  // namespace mt::train
