// Replays PipeDream-2BW's window without a flush (parallel/pipeline/no_flush.h) with its step updates in it,
// under the simulator's cost model (plan/simulator.h; one chunk per rank), for two ways the update of step t can
// wait for g_t's global norm (and, with it, every other reduction of the step):
//   norm_started  the reduction is started by each rank after its last backward of step t and completed at U(t):
//                 U(t) ends once every rank has finished its last backward of step t (the design of no_flush.h);
//   all_reached   U(t) is a blocking collective over the ranks (what the step's exchange is today): it ends once
//                 every rank has reached its U(t).
// An update itself costs update (default 0) units; messages as in plan/simulator.h. Throws ScheduleError when the
// window is broken (check_no_flush) or when a rank would wait forever under the chosen rule.
#pragma once

#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"

namespace mt::plan {

enum class UpdateWait { norm_started, all_reached };

// Makespan, busy time and bubble of the window; boxes hold the computations (kind forward or backward).
SimResult simulate_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                          const CostModel& cost, UpdateWait wait, double update = 0.0);

// PipeDream's and PipeMare's window (parallel/pipeline/micro_window.h) with its per-micro-batch updates as what
// they are in a run: collectives over the stages (micro-batch n's gradient norm, the tied embedding's sum):
// U(n) ends once every rank has reached its U(n), then costs `update`. Throws ScheduleError when the window is
// broken (check_micro_window).
SimResult simulate_micro_window(const pipeline::ScheduleSpec& spec, int steps, const pipeline::Schedule& window,
                                const CostModel& cost, double update = 0.0);

}  // namespace mt::plan
