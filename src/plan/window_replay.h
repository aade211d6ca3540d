// The event loop the two window replays share (plan/window_sim.h, plan/sync_window_sim.h): every rank runs its
// list until a wait for a message not sent yet or an update the window's rule holds; sends never wait, a wait
// ends C (cost.comm) after both the send and the receive's post; the ranks are swept until none moves. What an
// update waits for, what a computation costs and what its end releases stay with each replay. The one-step
// simulator (plan/simulator.cpp) keeps its own loop: it also charges sends and posts and asserts that a
// checked list never sticks.
#pragma once

#include <functional>
#include <string>

#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"

namespace mt::plan {

struct WindowReplayParts {
  // Which actions are computations (they take duration(j, a) on rank j and make a box); any other action that
  // is no message and no optimizer_step is passed over.
  std::function<bool(pipeline::ActionKind)> computes;
  std::function<double(int j, const pipeline::Action& a)> duration;
  // After computation a on rank j has ended at `end` (may be empty).
  std::function<void(int j, const pipeline::Action& a, double end)> computed;
  // An optimizer_step on rank j at time now: false holds the rank there (now unchanged, asked again on the next
  // sweep), true lets it pass (now moved to when the update ends).
  std::function<bool(int j, const pipeline::Action& a, double& now)> update;
};

// Replays window with message latency comm into r (placement, boxes, finish, busy, makespan, utilization,
// bubble). Returns "" when every list ran to its end, else the stuck ranks: "rank j at action k (action); ...".
std::string replay_window_lists(const pipeline::Schedule& window, double comm, const WindowReplayParts& parts,
                                SimResult& r);

}  // namespace mt::plan
