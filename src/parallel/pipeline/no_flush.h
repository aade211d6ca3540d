// PipeDream-2BW without a flush: one action list per rank spanning several optimizer steps (a "window" of K
// steps), in which step t+1's forwards fill the cool-down of step t, with the update of each step inside the
// list. A training run executes it through train/no_flush_steps.h (one piece of the list per step of the loop).
//
// Legend: p ranks (stages, one chunk each, the looped placement), m micro-batches per step, K steps in the
// window, t a step, j a rank, w_j = p - j - 1 (1F1B's warm-up on rank j); micro-batch k of step t is numbered
// i = t m + k in the window, so the window is a list over K m micro-batches.
//
// The rule (the delay-1 rule, two weight versions per stage): every forward and backward of step t
// reads W(t-1) (W(-1) = W(0)); the update of step t, U(t): W(t+1) = opt(W(t), g_t) with g_t clipped by its own
// global norm, writes W(t+1) into the buffer of W(t-1). So on rank j:
//   - U(t) comes after every backward of step t on rank j (they read W(t-1), which U(t) overwrites);
//   - every forward of step t comes after U(t-2) on rank j (it reads W(t-1), which U(t-2) makes);
//   - U(t) needs g_t's global norm: it can run only once every rank has run all its backwards of step t. The
//     executor starts that reduction after the rank's last backward of step t and completes it at U(t).
// At any point a rank then holds two versions: W(t-1) for step t's remaining backwards and W(t) for step
// t+1's forwards. A backward of step t+1 may run before U(t) on its rank (U(t) is placed late to give the
// norm time), so the gradients of step t+1 accumulate in a second buffer while g_t waits for its update.
//
// Compute order on rank j: 1F1B's order over the whole window with the two-version rule as the only limit:
// the forward of micro-batch i comes right after the rank's nb(i)-th backward,
//     nb(i) = max(0, i - w_j, (floor(i / m) - 1) m)
// (i - w_j: 1F1B's warm-up; (floor(i/m) - 1) m: every backward of step floor(i/m) - 2 first). With K = 1 this is
// 1F1B's list. When m >= p - 1 the second term never binds and the window is 1F1B over K m micro-batches: in
// steady state no rank idles between steps (equal stage costs). U(t) stands right before the first forward of
// step t + 2 on the rank (before that forward's wait for its input), or at the end of the list for the last two
// steps: the window ends with every update done (the flush a checkpoint or the run's end needs).
//
// Encoding: U(t) is optimizer_step with micro_batch = t m + m - 1 (the step's last micro-batch) and chunk -1.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

// The window spec: spec with K m micro-batches (what check_schedule and the simulator see).
ScheduleSpec window_spec(const ScheduleSpec& spec, int steps);

// The update of step t in a window of m micro-batches per step, and whether an action is one (an optimizer_step
// with a micro-batch and chunk -1).
Action step_update(int step, int micro_batches);
bool is_step_update(const Action& a);

// The compute order above for every rank (no messages, no updates). spec: pipedream-2bw's per-step spec
// (validated: V = 1); steps >= 1.
ActionLists no_flush_compute_order(const ScheduleSpec& spec, int steps);

// The whole window: the compute order, the messages by schedule.h's rule, and U(t) for every step placed as above.
Schedule no_flush_schedule(const ScheduleSpec& spec, int steps);

// The window's list without its step updates and with one step-end optimizer_step: a schedule over K m
// micro-batches that check_schedule and the simulator take as it is (an update costs nothing in the simulator,
// and U(t)'s norm never makes a rank wait in a list of no_flush_schedule: see check_no_flush).
Schedule without_step_updates(const Schedule& window);

// Checks a window (generated or written by hand), or throws ScheduleError naming the rank, the action's index
// and the action:
//  - the list without its updates passes check_schedule for window_spec (complete, messages matched, no
//    deadlock with sends that never block);
//  - each rank holds U(0), ..., U(K-1) once each, in that order, its last action an update;
//  - U(t) after every backward of step t on the rank, every forward of step t after U(t-2) on the rank;
//  - no deadlock once U(t) waits for g_t's norm: a replay in which sends never block, a wait ends once the
//    matching message has been sent and U(t) ends once every rank has run all its backwards of step t reaches
//    the end of every list.
void check_no_flush(const ScheduleSpec& spec, int steps, const Schedule& window);

// The first checks of every window of step updates (check_no_flush, check_sync_window), before its own rule: p
// lists, no optimizer_step but step updates, and the list without them passing check_schedule for window_spec.
// Throws ScheduleError naming the rank, the action's index and the action (or check_schedule's complaint).
void check_step_update_lists(const ScheduleSpec& spec, int steps, const Schedule& window);

// The deadlock replay of a window of steps, shared by check_no_flush, check_sync_window and check_micro_window:
// every rank runs its list as far as it can, a wait once its message was sent, an update (is_update) once
// update_held(j, pc) no longer holds it (the window's rule: pc is every rank's next action); ran(j, a) sees each
// action run. Throws ScheduleError("deadlock: ...") naming each stuck rank, its action and what it waits for
// (update_waits_for(a) for an update, its message otherwise).
void replay_window(const Schedule& window, const std::function<bool(const Action&)>& is_update,
                   const std::function<bool(int j, const std::vector<size_t>& pc)>& update_held,
                   const std::function<void(int j, const Action& a)>& ran,
                   const std::function<std::string(const Action&)>& update_waits_for);

}  // namespace mt::pipeline
