#include "train/micro_window_steps.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "parallel/pipeline/micro_window.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule_generator.h"
#include "plan/window_sim.h"
#include "train/no_flush_steps.h"
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

class MicroWindowSteps : public StepExecutor, private pipeline::StageRunner {
 public:
  MicroWindowSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace, MicroWindowParts parts)
      : task_(task), pp_(pp), trace_(trace), parts_(std::move(parts)), m_(pp.spec.micro_batches) {
    MT_ASSERT(pp_.spec.virtual_stages == 1 && parts_.share && parts_.window_ends_after,
              "the no-flush executor of per-micro-batch updates needs one chunk per rank and all its parts");
  }

  void set_versions(parallel::ParamVersions* v) override {
    versions_ = dynamic_cast<MicroVersions*>(v);
    MT_ASSERT(versions_, "per-micro-batch updates without a flush need the run's MicroVersions part");
  }

  void run(int64_t s, const BatchShare& share, const StepHooks&, const StepUpdate& update) override {
    MT_ASSERT(versions_, "per-micro-batch updates without weight versions");
    MT_ASSERT(share.micro_count() == m_, "a share of ", share.micro_count(), " micro-batches for a schedule of ", m_);
    for (int i = 0; i < share.micro_count(); i++)
      MT_ASSERT(share.micro_len(i) == share.micro_size(), "pipeline micro-batch ", i, " of ", share.micro_len(i),
                " windows in a share of micro-batches of ", share.micro_size());
    cur_ = s;
    if (!ex_.in_window()) open(s);
    MT_ASSERT(s >= first_ && s <= last_, "step ", s, " outside the window of steps ", first_, "..", last_);
    task_.begin_step(s);
    const int t = (int)(s - first_);
    int updates = 0;
    ex_.run_to(cut_[(size_t)t] + 1, [&] {
      const int n = next_update_++;  // updates run in backward order (check_micro_window)
      MT_ASSERT(n / m_ == t, "the update of window micro-batch ", n, " while running step ", s);
      TaskStageRunner& r = runner(t);
      double& before = loss_before_[t];
      update(r.loss - before, {n % m_, m_});
      before = r.loss;
      updates++;
    });
    MT_ASSERT(updates == m_, "step ", s, " ran ", updates, " updates, not ", m_);
    runners_.erase(t);
    loss_before_.erase(t);
    if (s == last_) {
      ex_.finish(&stats_);
      MT_ASSERT(runners_.empty(), "a window ended with work of a later step");
    }
  }
  bool calls_hooks() const override { return false; }
  pipeline::PipelineStats* stats() override { return &stats_; }

 private:
  // The window from step s to the next step after which the loop needs the flushed state.
  void open(int64_t s) {
    first_ = s;
    last_ = window_last_step(s, pp_.spec.stages, m_, parts_.window_ends_after);
    const int K = (int)(last_ - first_ + 1);
    spec_ = pipeline::window_spec(pp_.spec, K);
    window_ = pipeline::micro_window_schedule(pp_.spec, K);
    pipeline::check_micro_window(pp_.spec, K, window_);
    cut_.assign((size_t)K, 0);
    const std::vector<pipeline::Action>& list = window_[pp_.group->rank()];
    for (size_t k = 0; k < list.size(); k++)
      if (list[k].kind == pipeline::ActionKind::optimizer_step && list[k].micro_batch % m_ == m_ - 1)
        cut_[(size_t)(list[k].micro_batch / m_)] = k;
    runners_.clear();
    loss_before_.clear();
    next_update_ = 0;
    versions_->begin_window(window_, K * m_);
    ex_.begin(spec_, window_, *pp_.group, *this, trace_);
  }

  TaskStageRunner& runner(int t) {
    auto it = runners_.find(t);
    if (it == runners_.end())
      it = runners_.emplace(t, task_.stage_runner(first_ + t, parts_.share(first_ + t), nullptr)).first;
    return *it->second;
  }
  // Window micro-batch n belongs to step first_ + n / m: this call's step or (a forward run ahead) the next.
  int step_of(int n) const {
    const int t = n / m_;
    MT_ASSERT(first_ + t == cur_ || first_ + t == cur_ + 1, "micro-batch ", n, " of step ", first_ + t,
              " while running step ", cur_);
    return t;
  }
  size_t activation_count() const override {
    return const_cast<MicroWindowSteps*>(this)->runner((int)(cur_ - first_)).activation_count();
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

  TrainTask& task_;
  PipelineContext pp_;
  trace::ChromeTrace* trace_;
  MicroWindowParts parts_;
  const int m_;
  MicroVersions* versions_ = nullptr;
  pipeline::PipelineExecutor ex_;
  pipeline::PipelineStats stats_;
  pipeline::ScheduleSpec spec_;
  pipeline::Schedule window_;
  std::vector<size_t> cut_;  // [t]: index of the update of step t's last micro-batch in this rank's list
  std::map<int, std::unique_ptr<TaskStageRunner>> runners_;
  std::map<int, double> loss_before_;  // [t]: the loss of step t's runner at its last update
  int64_t first_ = 0, last_ = -1, cur_ = 0;
  int next_update_ = 0;
};

}  // namespace

std::unique_ptr<StepExecutor> make_micro_window_steps(TrainTask& task, const PipelineContext& pp,
                                                      trace::ChromeTrace* trace, MicroWindowParts parts) {
  return std::make_unique<MicroWindowSteps>(task, pp, trace, std::move(parts));
}

}  // namespace mt::train
