// The consistency and deadlock check for pipeline action lists (schedule.h), for any list, generated or
// written by hand. Cheap (linear in the number of actions), so the executor may run it before a step.
//
// What it proves, or throws ScheduleError naming the rank, the action's index and the action:
//  - shape: one list per rank, a placement of p ranks x V chunks; micro-batch and chunk in range, and the
//    chunk on the micro-batch's route; each send or receive names the rank that holds the neighbouring stage
//    of that micro-batch (the schedule's placement), and only where that stage is on another rank;
//    optimizer_step once, last;
//  - on each rank: every (i, c) of i's route is forwarded once and backwarded once (or input-gradient then
//    weight-gradient half), the forward first; a computation
//    with an input from another rank comes after the wait for it, and a wait after its post; with an input
//    from the same rank (p == 1), after the computation that produces it; every output another rank needs
//    is sent once, after it is computed; every posted receive is waited for;
//  - matching: per channel (sender, receiver, activation or gradient), the n-th receive the receiver posts
//    is for the n-th message the sender sends, so FIFO matching by (source, tag) pairs the right tensors;
//  - no deadlock: a replay in which sends never block and a wait ends once the matching send has been
//    issued reaches the end of every list. Sends that never block are the executor's side of the contract
//    (isend, completed after the last action).
#pragma once

#include "core/error.h"
#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

// A list that breaks the rules above: a bug in the generator that made it.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

// Throws mt::InputError when p, m or V is below 1 (the schedule name is not looked at, so a list from any
// generator can be checked), ScheduleError when the list is wrong.
void check_schedule(const ScheduleSpec& spec, const Schedule& schedule);

}  // namespace mt::pipeline
