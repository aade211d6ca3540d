// PipeDream and PipeMare without a flush: one action list per rank spanning a window of K optimizer steps, for the
// schedules that update each stage after every micro-batch (schedule_generator.h MicroUpdates: pipedream,
// pipemare). A training run executes it through train/micro_window_steps.h, one piece per step of the loop.
//
// Legend: p ranks (stages, one chunk each, the looped placement), m micro-batches per step, K steps in the
// window; micro-batch k of the window's step t is numbered n = t m + k, so the window is a list over K m
// micro-batches; U(n) = optimizer_step(n), the update of the rank's stage after micro-batch n's backward.
//
// The list: the generator's own list for K m micro-batches (1F1B's order over the whole window, U(n) right
// after backward n and its send). There is no step boundary in it: on rank j the forward of micro-batch n runs
// once the rank has run max(0, n - (p - 1 - j)) backwards (1F1B's warm-up), whatever step n belongs to, so
// step t+1's first forwards on stage 0 run before step t's last backwards and updates. The window ends with
// every backward and update done (the flush a checkpoint, an evaluation or the run's end needs).
//
// U(n) is collective over the stages (the gradient norm of micro-batch n over all stages, the tied embedding's
// two parts summed): it ends only once every rank has reached its own U(n). check_micro_window proves the
// list runs to the end under that rule.
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

// The window: spec's generator (pipedream or pipemare, V = 1) run for K m micro-batches; steps >= 1.
Schedule micro_window_schedule(const ScheduleSpec& spec, int steps);

// Checks a window (generated or written by hand), or throws ScheduleError naming the rank, the action's index
// and the action:
//  - the list passes check_schedule for window_spec(spec, steps) (complete, messages matched, an update after
//    each backward, no deadlock with sends that never block);
//  - each rank's updates are U(0), ..., U(K m - 1) in that order, each right after its backward (only that
//    backward's send between them): an update per micro-batch as its backward completes;
//  - no deadlock once every U(n) waits for every rank's U(n) (the collective norm): a replay in which sends
//    never block, a wait ends once the matching message has been sent, and U(n) ends once every rank has
//    reached U(n), reaches the end of every list.
void check_micro_window(const ScheduleSpec& spec, int steps, const Schedule& window);

// Per rank, the most weight versions the rank's stage holds at once along its list, under weight stashing
// (stashed = true: the newest version plus, for every micro-batch whose forward has run and whose backward has
// not, the version its forward read; version = the rank's updates before the forward, or vsync[n] when given)
// or without (only the newest: 1). Looked at after each forward, at each backward and after each update, as
// train/weight_stash.h instruments it.
std::vector<int> stash_depths(const Schedule& window, bool stashed, const std::vector<int>& vsync = {});

// Per rank, the schedule's in-flight count: the most micro-batches whose forward has run and whose backward has
// not (peak_in_flight of the rank's list).
std::vector<int> in_flight_counts(const Schedule& window);

}  // namespace mt::pipeline
