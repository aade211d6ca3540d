#include "plan/window_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/micro_window.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/window_replay.h"

namespace mt::plan {

using pipeline::Action;
using pipeline::ActionKind;

namespace {

// The replay of a checked window: updates optimizer_step(i) grouped by t = i / m over `steps` groups.
SimResult replay(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                 const CostModel& cost, UpdateWait wait, double update) {
  MT_CHECK_INPUT(std::isfinite(cost.forward) && cost.forward > 0 && std::isfinite(cost.backward_ratio) &&
                     cost.backward_ratio >= 0 && std::isfinite(cost.comm) && cost.comm >= 0 && std::isfinite(update) &&
                     update >= 0,
                 "simulate_window: forward must be > 0, backward ratio, message and update costs >= 0");
  const int p = spec.stages, m = spec.micro_batches;
  MT_CHECK_INPUT(cost.stage_forward.empty() || (int)cost.stage_forward.size() == p,
                 "simulate_window: stage_forward has ", cost.stage_forward.size(), " entries for ", p, " stages");
  MT_CHECK_INPUT(cost.stage_backward.size() == cost.stage_forward.size(), "simulate_window: stage_backward has ",
                 cost.stage_backward.size(), " entries, stage_forward ", cost.stage_forward.size());
  MT_CHECK_INPUT(cost.rank_chunk_forward.empty() && cost.rank_chunk_backward.empty() && cost.rank_chunk_weight.empty(),
                 "simulate_window takes per-stage times only (no per-(rank, chunk) times)");
  auto fwd = [&](int j) { return cost.stage_forward.empty() ? cost.forward : cost.stage_forward[j]; };
  auto bwd = [&](int j) { return cost.stage_forward.empty() ? cost.backward_ratio * cost.forward : cost.stage_backward[j]; };

  // Per step: the ranks still to finish its backwards (norm_started) or to reach its update (all_reached), and
  // the latest time one of them did.
  std::vector<std::vector<int>> left_b((size_t)p, std::vector<int>((size_t)steps, 0));
  for (int j = 0; j < p; j++)
    for (const Action& a : window[j])
      if (a.kind == ActionKind::backward) left_b[j][a.micro_batch / m]++;
  std::vector<int> pending((size_t)steps, 0);
  std::vector<double> ready((size_t)steps, 0.0);
  for (int t = 0; t < steps; t++)
    for (int j = 0; j < p; j++) pending[t] += wait == UpdateWait::all_reached || left_b[j][t] > 0 ? 1 : 0;
  std::vector<std::vector<bool>> arrived((size_t)p, std::vector<bool>((size_t)steps, false));

  WindowReplayParts parts;
  parts.computes = [](ActionKind k) { return k == ActionKind::forward || k == ActionKind::backward; };
  parts.duration = [&](int j, const Action& a) { return a.kind == ActionKind::forward ? fwd(j) : bwd(j); };
  parts.computed = [&](int j, const Action& a, double end) {
    if (a.kind != ActionKind::backward || wait != UpdateWait::norm_started) return;
    const int t = a.micro_batch / m;
    if (--left_b[j][t] == 0) {
      pending[t]--;
      ready[t] = std::max(ready[t], end);
    }
  };
  parts.update = [&](int j, const Action& a, double& now) {
    const int t = a.micro_batch / m;
    if (wait == UpdateWait::all_reached && !arrived[j][t]) {
      arrived[j][t] = true;
      pending[t]--;
      ready[t] = std::max(ready[t], now);
    }
    if (pending[t] > 0) return false;
    now = std::max(now, ready[t]) + update;
    return true;
  };
  SimResult r;
  const std::string stuck = replay_window_lists(window, cost.comm, parts, r);
  if (!stuck.empty())
    throw pipeline::ScheduleError(
        str("deadlock with ", wait == UpdateWait::all_reached ? "blocking updates" : "updates waiting for the norm",
            ": ", stuck));
  return r;
}

}  // namespace

SimResult simulate_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                          const CostModel& cost, UpdateWait wait, double update) {
  pipeline::check_no_flush(spec, steps, window);
  return replay(spec, steps, window, cost, wait, update);
}

SimResult simulate_micro_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                                const CostModel& cost, double update) {
  pipeline::check_micro_window(spec, steps, window);
  // Every micro-batch's update is a group of its own: the replay of K m groups of one micro-batch each.
  pipeline::ScheduleSpec one = spec;
  one.micro_batches = 1;
  return replay(one, steps * spec.micro_batches, window, cost, UpdateWait::all_reached, update);
}

}  // namespace mt::plan
