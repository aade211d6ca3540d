#include "plan/sync_window_sim.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/sync_window.h"
#include "plan/window_replay.h"

namespace mt::plan {

using pipeline::Action;
using pipeline::ActionKind;

double SyncWindowSim::step() const {
  MT_CHECK_INPUT(update_end.size() >= 2, "a time per step needs a window of at least two steps, got ",
                 update_end.size());
  return update_end.back() - update_end[update_end.size() - 2];
}

SyncWindowSim simulate_sync_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                                   const CostModel& cost, StepUpdateWait wait, double update) {
  pipeline::check_sync_window(spec, steps, window);
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  MT_CHECK_INPUT(std::isfinite(cost.forward) && cost.forward > 0 && finite_nonneg(cost.backward_ratio) &&
                     finite_nonneg(cost.comm) && finite_nonneg(cost.weight_share) && cost.weight_share <= 1 &&
                     finite_nonneg(update),
                 "simulate_sync_window: forward must be > 0; backward ratio, message and update costs >= 0; the "
                 "weight share in [0, 1]");
  MT_CHECK_INPUT(cost.stage_forward.empty() && cost.stage_backward.empty() && cost.stage_weight.empty() &&
                     cost.rank_chunk_forward.empty() && cost.rank_chunk_backward.empty() &&
                     cost.rank_chunk_weight.empty(),
                 "simulate_sync_window takes the nominal cost model only (no per-stage times)");
  const int p = spec.stages, m = spec.micro_batches;
  const double F = cost.forward, B = cost.backward_ratio * F, w = cost.weight_share, C = cost.comm;
  auto duration = [&](ActionKind k) {
    switch (k) {
      case ActionKind::forward: return F;
      case ActionKind::backward: return B;
      case ActionKind::backward_input: return (1 - w) * B;
      case ActionKind::backward_weight: return w * B;
      default: return 0.0;
    }
  };

  // reach[t][j]: when rank j arrived at U(t) (-1: not yet); done[t][j]: when its U(t) ended.
  std::vector<std::vector<double>> reach((size_t)steps, std::vector<double>((size_t)p, -1.0));
  std::vector<int> arrived((size_t)steps, 0);
  std::vector<double> last_input((size_t)steps, 0.0);  // [t]: when rank p - 1's last input half (or backward) ended
  // When U(t) may end on rank j, once every rank has arrived (norm_chain, blocking).
  auto release = [&](int t, int j) {
    const std::vector<double>& r = reach[(size_t)t];
    if (wait == StepUpdateWait::blocking) return *std::max_element(r.begin(), r.end());
    if (wait == StepUpdateWait::tied_ends) return std::max(r[0], r[(size_t)p - 1]);
    if (wait == StepUpdateWait::tied_wte_early) return std::max(r[0], last_input[(size_t)t]);
    double partial = r[(size_t)p - 1];  // the partial leaving rank p - 1, then p - 2, ..., 0 (which holds the norm)
    for (int k = p - 2; k >= 0; k--) partial = std::max(r[(size_t)k], partial + C);
    return partial + C * j;  // the factor, passed down one stage at a time
  };

  SyncWindowSim out;
  out.update_end.assign((size_t)steps, 0.0);
  WindowReplayParts parts;
  parts.computes = pipeline::is_compute;
  parts.duration = [&](int, const Action& a) { return duration(a.kind); };
  parts.computed = [&](int j, const Action& a, double end) {
    if (j == p - 1 && pipeline::is_backward(a.kind)) last_input[(size_t)(a.micro_batch / m)] = end;
  };
  parts.update = [&](int j, const Action& a, double& now) {
    const int t = a.micro_batch / m;
    if (reach[(size_t)t][(size_t)j] < 0) {
      reach[(size_t)t][(size_t)j] = now;
      arrived[(size_t)t]++;
    }
    const bool tied = wait == StepUpdateWait::tied_ends || wait == StepUpdateWait::tied_wte_early;
    const bool waits =
        wait == StepUpdateWait::norm_chain || wait == StepUpdateWait::blocking || (tied && (j == 0 || j == p - 1));
    if (waits) {
      if (tied ? reach[(size_t)t][0] < 0 || reach[(size_t)t][(size_t)p - 1] < 0 : arrived[(size_t)t] < p) return false;
      now = std::max(now, release(t, j));
    }
    now += update;
    out.update_end[(size_t)t] = std::max(out.update_end[(size_t)t], now);
    return true;
  };
  const std::string stuck = replay_window_lists(window, C, parts, out.result);
  if (!stuck.empty()) throw pipeline::ScheduleError("simulate_sync_window: deadlock: " + stuck);
  return out;
}

}  // namespace mt::plan
