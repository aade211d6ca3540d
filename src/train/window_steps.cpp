#include "train/window_steps.h"

#include "core/error.h"
#include "parallel/pipeline/no_flush.h"

namespace mt::train {

WindowSteps::WindowSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace,
                         std::function<BatchShare(int64_t)> share, std::function<bool(int64_t)> window_ends_after)
    : task_(task), pp_(pp), trace_(trace), m_(pp.spec.micro_batches), share_(std::move(share)),
      window_ends_after_(std::move(window_ends_after)) {}

void WindowSteps::enter(int64_t s, const BatchShare& share) {
  MT_ASSERT(share.micro_count() == m_, "a share of ", share.micro_count(), " micro-batches for a schedule of ", m_);
  cur_ = s;
}

void WindowSteps::open_at(int64_t s) {
  if (!ex_.in_window()) open(s);
  MT_ASSERT(s >= first_ && s <= last_, "step ", s, " outside the window of steps ", first_, "..", last_);
}

// The window from step s to the next step after which the loop needs the settled state.
void WindowSteps::open(int64_t s) {
  first_ = s;
  last_ = window_last_step(s, pp_.spec.stages, m_, window_ends_after_);
  const int K = (int)(last_ - first_ + 1);
  spec_ = pipeline::window_spec(pp_.spec, K);
  window_ = window_list(K);
  cut_.assign((size_t)K, 0);
  const std::vector<pipeline::Action>& list = window_[pp_.group->rank()];
  for (size_t k = 0; k < list.size(); k++)
    if (list[k].kind == pipeline::ActionKind::optimizer_step && ends_step(list[k]))
      cut_[(size_t)(list[k].micro_batch / m_)] = k;
  runners_.clear();
  opened(K, window_);
  ex_.begin(spec_, window_, *pp_.group, *this, trace_, local_updates());
}

void WindowSteps::run_step(int64_t s, int updates, const std::function<void()>& update) {
  const int t = (int)(s - first_);
  int ran = 0;
  ex_.run_to(cut_[(size_t)t] + 1, [&] {
    ran++;
    update();
  });
  MT_ASSERT(ran == updates, "step ", s, " ran ", ran, " updates, not ", updates);
}

bool WindowSteps::leave(int64_t s) {
  if (s != last_) return false;
  ex_.finish(&stats_);
  return true;
}

TaskStageRunner& WindowSteps::runner(int t) {
  auto it = runners_.find(t);
  if (it == runners_.end()) it = runners_.emplace(t, task_.stage_runner(first_ + t, share_(first_ + t), nullptr)).first;
  return *it->second;
}

size_t WindowSteps::activation_count() const {
  return const_cast<WindowSteps*>(this)->runner((int)(cur_ - first_)).activation_count();
}

}  // namespace mt::train
