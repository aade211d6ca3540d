// Replays a back-to-back window of a synchronous one-chunk schedule (parallel/pipeline/sync_window.h) with its
// step updates in it, under the simulator's cost model (plan/simulator.h: forward F, backward R F split into
// (1 - w) R F and w R F for zb-h1 / zb-h2, message C), for three things the update U(t) can wait for:
//   local       nothing but the rank's own list (each stage's update needs only its own gradient: no global-norm
//               clipping, no check of the whole gradient before the update);
//   norm_chain  g_t's global norm passed up the pipeline: rank p - 1 sends its partial when it reaches U(t), rank j
//               sends its own plus rank j + 1's once it has reached U(t) and that partial has arrived (C after it
//               was sent); rank 0 then holds the norm and sends the clip factor down, rank j receiving it C after
//               rank j - 1; U(t) on rank j ends at max(its arrival at U(t), the factor's arrival) + update;
//   blocking    a collective over the ranks (the trainer's reductions today): U(t) ends on every rank once every
//               rank has reached it, + update;
//   tied_ends   the GPT's tied embedding at p > 1 without any global norm: the first and the last stage each hold
//               a copy of wte whose gradients are summed (a collective of the two) before either updates, so U(t)
//               on ranks 0 and p - 1 ends once both have reached it; the ranks between update locally. (This was
//               the tie while the last stage took wte's gradient in its W, the last computation of its step in
//               zb-h1 / zb-h2 lists.)
//   tied_wte_early  the tie as trained without clipping (train/sync_window_steps.h: the last stage takes wte's
//               gradient with its input half and sends it then): U(t)
//               on rank 0 ends once rank p - 1's last input half (or whole backward) of step t has ended, on rank
//               p - 1 once rank 0 has reached U(t); the ranks between update locally.
// With C = 0 norm_chain and blocking give the same times: in either, U(t) waits for every rank's last computation
// of step t (sync_window.h shows why no one-chunk list then steps faster than (p - 1) F + m (F + B + W)). Under
// tied_ends rank 0's update still waits for rank p - 1's last W of the step, which gives the same bound.
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"

namespace mt::plan {

enum class StepUpdateWait { local, norm_chain, blocking, tied_ends, tied_wte_early };

struct SyncWindowSim {
  SimResult result;                 // makespan, busy, bubble of the whole window; boxes hold the computations
  std::vector<double> update_end;   // [t]: when the last rank's U(t) ended
  // The time per step in the window's steady state: update_end[K-1] - update_end[K-2] (K >= 2).
  double step() const;
};

// Checks the window first (check_sync_window). Throws mt::InputError for a bad cost model or update < 0, or a
// cost model with per-stage times (not supported here), ScheduleError when the window is broken.
SyncWindowSim simulate_sync_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                                   const CostModel& cost, StepUpdateWait wait, double update = 0.0);

}  // namespace mt::plan
