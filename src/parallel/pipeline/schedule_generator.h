// A schedule generator: the part of a pipeline schedule that differs between schedules (which specs it
// builds, where the stages go, the order of the computations on each rank); schedule.h adds the messages
// and the optimizer step by one rule for all of them. One generator per file in schedules/; the registry
// (schedules/registry.cpp) is the one table of them, looked up by name once when a run starts.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/pipeline/placement.h"
#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

class ScheduleGenerator {
 public:
  virtual ~ScheduleGenerator() = default;
  virtual const char* name() const = 0;
  // Throws mt::InputError naming the values when the generator cannot build spec (p, m, V >= 1 and the
  // size limit are checked before).
  virtual void validate(const ScheduleSpec& spec) const = 0;
  // Where the stages go; the looped placement unless the generator chooses another.
  virtual Placement placement(const ScheduleSpec& spec) const {
    return Placement::looped(spec.stages, spec.virtual_stages);
  }
  // Step 1 of schedule.h: the compute actions of each rank, in order, for a valid spec.
  virtual ActionLists compute_order(const ScheduleSpec& spec, const Placement& placement) const = 0;
  // Versions of each stage's weights the schedule's update rule keeps. 1: synchronous, every micro-batch of
  // step t reads W(t), and the run equals the single-process one. 2: the delay-1 rule (PipeDream-2BW): step
  // t's gradient is taken at W(t-1) and applied to W(t), which changes the math (train/weight_versions.h
  // keeps the second version; the run composes it when the generator asks for it).
  virtual int weight_versions() const { return 1; }
  // Schedules that update each stage after every micro-batch's backward (an optimizer_step(i) action after
  // backward i in each list, schedules/pipedream.cpp): which weights that backward reads. none: one update per
  // step at the end of the list. stashed (PipeDream): the version its forward on this stage read. newest
  // (PipeMare, Pipelined Backpropagation): the stage's newest weights. Both change the math.
  enum class MicroUpdates { none, stashed, newest };
  virtual MicroUpdates micro_updates() const { return MicroUpdates::none; }
};

// The generator called name; throws mt::InputError listing the known names when there is none.
const ScheduleGenerator& find_schedule(const std::string& name);

// The registry's entries, one per file in schedules/.
std::unique_ptr<ScheduleGenerator> make_gpipe_schedule();
std::unique_ptr<ScheduleGenerator> make_one_f_one_b_schedule();
std::unique_ptr<ScheduleGenerator> make_interleaved_schedule();
std::unique_ptr<ScheduleGenerator> make_pipedream_2bw_schedule();
std::unique_ptr<ScheduleGenerator> make_zb_h1_schedule();
std::unique_ptr<ScheduleGenerator> make_zb_h2_schedule();
std::unique_ptr<ScheduleGenerator> make_zb_v_schedule();
std::unique_ptr<ScheduleGenerator> make_chimera_schedule();
std::unique_ptr<ScheduleGenerator> make_pipedream_schedule();
std::unique_ptr<ScheduleGenerator> make_pipemare_schedule();

// 1F1B's order with an optimizer_step(i, chunk 0) right after each backward of micro-batch i (pipedream,
// pipemare; one chunk per rank).
ActionLists one_f_one_b_with_updates(const ScheduleSpec& spec, const Placement& placement);

// The zero-bubble schedules' order on one rank (schedules/deferred_weight.cpp), chunk 0: `warmup` forwards (at
// most m), then forward and input-gradient half alternately, then the remaining input halves; the weight half
// of micro-batch i right after the input half of i + lag, the W's still owed after the last input half at the end.
std::vector<Action> deferred_weight_order(int m, int warmup, int lag);

// A unit-time greedy list scheduler (schedules/greedy_order.cpp; zb-v and chimera): at each unit t = 0, 1, ...
// each rank j in turn asks the rule for an action; the builder appends it to j's list and records it (a forward
// or backward of (i, s) ends at t + 1; an input half owes its weight half, which the rule may pick from
// pending_weights(j) later; a forward holds micro-batch i in flight until its backward or weight half). Every
// action takes one unit and messages are free; the rule sees only what has ended by t.
class GreedyState {
 public:
  static constexpr long kNever = -1;
  long t() const { return t_; }
  // When (i, s)'s forward, and its backward or input half, ended; kNever until scheduled.
  long f_end(int i, int s) const { return f_end_[(size_t)i * S_ + s]; }
  long b_end(int i, int s) const { return b_end_[(size_t)i * S_ + s]; }
  bool ready(long end) const { return end != kNever && end <= t_; }
  // How many forwards and backwards (or input halves) rank j's chunk c has run.
  int forwards(int j, int c) const { return next_f_[(size_t)j * pl_.chunks() + c]; }
  int backwards(int j, int c) const { return next_b_[(size_t)j * pl_.chunks() + c]; }
  // (micro-batch, chunk) pairs rank j holds from their forward to their backward or weight half.
  int live(int j) const { return live_[j]; }
  // Weight halves rank j owes, in the order their input halves ran.
  const std::deque<Action>& pending_weights(int j) const { return pending_[j]; }

 private:
  friend ActionLists greedy_order(const char*, const Placement&, int, long,
                                  const std::function<std::optional<Action>(int, const GreedyState&)>&, long*);
  GreedyState(int micro_batches, const Placement& placement);
  void apply(int j, const Action& a);
  long t_ = 0;
  int S_;
  std::vector<long> f_end_, b_end_;
  std::vector<int> next_f_, next_b_, live_;
  std::vector<std::deque<Action>> pending_;
  const Placement& pl_;
};
using GreedyRule = std::function<std::optional<Action>(int j, const GreedyState& state)>;
// Runs the greedy until `actions` computations are placed over all ranks (name: for the no-progress assertion).
// `units`, when given, receives the list's length in units (the end of its last action under the unit costs), or
// -1 with empty lists when the rule stops making progress (without it, that is an assertion failure).
ActionLists greedy_order(const char* name, const Placement& placement, int micro_batches, long actions,
                         const GreedyRule& rule, long* units = nullptr);

}  // namespace mt::pipeline
