// Replays pipeline schedules (parallel/pipeline/schedule.h) under a cost model: each rank runs its list in
// order; a forward of one chunk takes `forward` time units, a backward `backward_ratio` times that, a
// message arrives `comm` units after its send; a receive waits for its message. Pure computation: no
// ranks, no communication, so it runs anywhere at once.
//
// Utilization = busy compute time / (p * makespan); bubble = 1 - utilization. For GPipe and 1F1B with
// zero communication cost the bubble is (p-1)/(m+p-1) whatever the backward ratio; with p = 4 and
// backward = 2 forward, GPipe's utilization is 3/12 = 25% at m = 1, 48/84 = 57.1% at m = 4, 96/132 = 72.7%
// at m = 8. Interleaving V chunks (each 1/V of a stage's work) shrinks the bubble to about (p-1)/(Vm+p-1).
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::plan {

struct CostModel {
  double forward = 1.0;         // one micro-batch through one whole stage (a chunk takes forward / V)
  double backward_ratio = 2.0;  // backward time / forward time
  double comm = 0.0;            // send-to-receive latency
};

struct Box {
  int rank;
  pipeline::ActionKind kind;  // forward or backward
  int micro_batch, chunk;
  double start, end;
};

struct Simulation {
  int ranks = 0;
  std::vector<Box> boxes;
  double makespan = 0, busy = 0, utilization = 0, bubble = 0;
};

Simulation simulate(const pipeline::ScheduleSpec& spec, const std::vector<std::vector<pipeline::Action>>& lists,
                    const CostModel& cost);

}  // namespace mt::plan
