// Synchronous one-chunk schedules (1f1b, zb-h1, zb-h2) run back to back: one list per rank spanning K optimizer
// steps (a "window"), with no barrier between steps, each step's update inside the list. The arithmetic is the
// flushed run's: every computation of step t + 1 on rank j reads W(t + 1) of its stage, which the update of
// step t, U(t), makes on that rank. So, on rank j:
//   - U(t) comes after every computation of step t on the rank (forward, backward, both halves of a split
//     one: the last W adds the last part of the rank's gradient g_t);
//   - every computation of step t + 1 comes after U(t) on the rank.
// Nothing else orders two steps, so rank j's list is its one-step list for step 0, U(0), the same list for step
// 1 with its micro-batches renumbered, U(1), ...: micro-batch k of step t is i = t m + k in the window (the
// encoding of no_flush.h: U(t) is optimizer_step with micro_batch t m + m - 1 and chunk -1).
//
// What U(t) waits for is the update rule's, not the list's (plan/sync_window_sim.h replays each):
//   local     the rank's own gradient only (no global-norm clipping, no check of the whole gradient before the
//             update): a stage may update and start step t + 1 while later stages still run step t's deferred W's.
//             This is the zero-bubble paper's steady state; zb-h2 then steps at m (F + B + W).
//   norm      g_t's global norm (clipping; the trainer's non-finite stop): U(t) on any rank ends only once
//             every rank has finished its computations of step t (however the norm's partials travel: an
//             all-reduce, or stage s adding its share to stage s + 1's and passing it towards stage 0). Then no
//             one-chunk list steps faster than (p - 1) F + m (F + B + W), the synchronized step's bound:
//             rank p - 1's step t + 1 work (m (F + B + W)) cannot start before rank 0's first forward of step
//             t + 1 has passed p - 1 stages, that forward comes after U(t) on rank 0, and U(t + 1) on rank 0
//             waits for rank p - 1's last computation of step t + 1. Running the steps back to back gains
//             nothing under this rule (the last session's "b2b" figures assumed the local rule).
#pragma once

#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

// Whether spec's schedule has a back-to-back window: 1f1b, zb-h1 or zb-h2 (one chunk per rank, one step-end
// update). reason (may be null) says why not.
bool sync_window_applies(const ScheduleSpec& spec, std::string* reason = nullptr);

// The window of `steps` steps for every rank, as above (validates spec; throws mt::InputError when
// sync_window_applies is false or steps < 1).
Schedule sync_window_schedule(const ScheduleSpec& spec, int steps);

// Checks a window (generated or written by hand), or throws ScheduleError naming the rank, the action's index
// and the action:
//  - the list without its step updates passes check_schedule for window_spec(spec, steps) (complete, messages
//    matched, no deadlock with sends that never block);
//  - each rank holds U(0), ..., U(K-1) once each, in that order, its last action U(K-1), and no other
//    optimizer_step;
//  - on each rank every computation of step t lies after U(t - 1) and before U(t);
//  - no deadlock under the norm rule: a replay in which sends never block, a wait ends once its message has
//    been sent and U(t) ends once every rank has run all its computations of step t reaches the end of every
//    list (the local rule waits for less, so it cannot deadlock either).
void check_sync_window(const ScheduleSpec& spec, int steps, const Schedule& window);

}  // namespace mt::pipeline
