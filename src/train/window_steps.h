// What the three step executors of a window of steps share (train/no_flush_steps.h, micro_window_steps.h,
// sync_window_steps.h): each runs one list of a window of K steps (parallel/pipeline/no_flush.h,
// micro_window.h, sync_window.h) in pieces, one per call of the step loop, so that run_steps (trainer.cpp) stays
// as it is. This part opens the window (its last step, its list, and per step t of the window the index in this
// rank's list after which step t's last update has run), runs a call's piece up to that update, ends the window
// after its last step, and keeps the stage runners of the window's steps (made from each step's share, on first
// use). What a computation reads and writes (weight version, gradient) and what an update does stay with each
// executor. What does not live here: the rule of each list (parallel/pipeline), the step loop (trainer.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "train/step_executor.h"

namespace mt::train {

inline constexpr int kMaxWindowSteps = 64;

// The last step of the window that opens at step s: the first step after which the loop needs the settled state
// (ends_after), at most kMaxWindowSteps steps, and few enough that the window's K m p (micro-batch, stage) pairs
// stay within what a schedule may hold (1,000,000: schedule.cpp's limit, which the one-step list met at config
// time).
inline int64_t window_last_step(int64_t s, int stages, int m, const std::function<bool(int64_t)>& ends_after) {
  const int64_t most = std::clamp<int64_t>(1'000'000 / ((int64_t)stages * m), 1, kMaxWindowSteps);
  int64_t last = s;
  while (!ends_after(last) && last - s + 1 < most) last++;
  return last;
}

class WindowSteps : public StepExecutor, protected pipeline::StageRunner {
 public:
  bool calls_hooks() const override { return false; }
  pipeline::PipelineStats* stats() override { return &stats_; }

 protected:
  // share: this rank's share of step s; window_ends_after: the loop needs the settled state after step s.
  WindowSteps(TrainTask& task, const PipelineContext& pp, trace::ChromeTrace* trace,
              std::function<BatchShare(int64_t)> share, std::function<bool(int64_t)> window_ends_after);

  // The window's list of K steps (window numbering: micro-batch n belongs to step first_ + n / m), checked as
  // the executor's rule needs.
  virtual pipeline::Schedule window_list(int K) const = 0;
  // Whether the optimizer_step action a ends its step (default: every update; the last of a step is kept).
  virtual bool ends_step(const pipeline::Action&) const { return true; }
  // What the executor resets when a window of K steps opens (list: the window's list), just before the pipeline
  // executor begins it.
  virtual void opened(int, const pipeline::Schedule&) {}
  // The window's updates issue no blocking collective (PipelineExecutor::begin's local_updates).
  virtual bool local_updates() const { return false; }

  // Checks share against the schedule's m micro-batches and sets the step being run.
  void enter(int64_t s, const BatchShare& share);
  // Opens the window at step s unless one is open, and checks that s lies in it.
  void open_at(int64_t s);
  // Runs this rank's actions through step s's last update, calling update at each optimizer_step action; checks
  // that there were `updates` of them.
  void run_step(int64_t s, int updates, const std::function<void()>& update);
  // After step s: ends the window if s is its last step (completes its sends, adds the stats); whether it did.
  bool leave(int64_t s);

  // The stage runner of window step t (made on first use, dropped by drop_runner or when a window opens).
  TaskStageRunner& runner(int t);
  void drop_runner(int t) { runners_.erase(t); }
  bool runners_empty() const { return runners_.empty(); }
  size_t activation_count() const override;

  TrainTask& task_;
  PipelineContext pp_;
  trace::ChromeTrace* trace_;
  const int m_;
  int64_t first_ = 0, last_ = -1, cur_ = 0;

 private:
  void open(int64_t s);

  std::function<BatchShare(int64_t)> share_;
  std::function<bool(int64_t)> window_ends_after_;
  pipeline::PipelineExecutor ex_;
  pipeline::PipelineStats stats_;
  pipeline::ScheduleSpec spec_;
  pipeline::Schedule window_;
  std::vector<size_t> cut_;  // [t]: index of step t's last update in this rank's list
  std::map<int, std::unique_ptr<TaskStageRunner>> runners_;
};

}  // namespace mt::train
