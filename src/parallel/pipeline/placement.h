// Stage placement: which pipeline rank and which of its chunks compute global stage s, as data a schedule
// generator chooses (schedule.h carries it beside the action lists). The executor, the checker, the simulator
// and the task that builds a rank's chunks all read it here; nothing else computes a stage from a rank.
//
// Legend: p ranks, V chunks per rank, S global stages (the model split in S consecutive parts), R routes;
// j rank, c chunk, s stage, i micro-batch.
//
// A route is one path of a micro-batch through the S stages: route[s] = (rank, chunk). Micro-batch i takes
// route i mod R. Every (rank, chunk) slot lies on exactly one route and so computes exactly one stage; a
// stage may be held by several slots (one per route: a bidirectional pipeline holds every stage twice).
//
//   looped (Megatron-LM's interleaved assignment; V = 1: stage = rank), p = 2, V = 2:
//     stage   0      1      2      3
//     slot   (0,0)  (1,0)  (0,1)  (1,1)        rank 1 hands stage 1 to rank 0's chunk 1
//   V-shaped, p = 2, V = 2 (the last rank keeps stages p - 1 and p: handed over in memory, no message):
//     slot   (0,0)  (1,0)  (1,1)  (0,1)
//   bidirectional, p = 2, S = 2, R = 2 (even micro-batches go down, odd ones up; every stage held twice):
//     route 0: (0,0) (1,0)     route 1: (1,1) (0,1)
#pragma once

#include <string>
#include <vector>

namespace mt::pipeline {

struct Slot {
  int rank = -1, chunk = -1;
  bool operator==(const Slot&) const = default;
};

class Placement {
 public:
  Placement() = default;
  // routes[r][s]: the slot computing stage s on route r. Throws mt::InputError naming the first broken rule
  // when the routes do not cover each of the p x V slots exactly once with the same S stages each.
  Placement(int ranks, int chunks, std::vector<std::vector<Slot>> routes);

  // Chunk c of rank j is stage c p + j (one route).
  static Placement looped(int ranks, int chunks);

  int ranks() const { return p_; }
  int chunks() const { return V_; }
  int stages() const { return S_; }
  int routes() const { return (int)routes_.size(); }
  int route_of(int micro_batch) const { return micro_batch % routes(); }
  // The stage chunk c of rank j computes.
  int stage_of(int rank, int chunk) const { return stage_[(size_t)rank * V_ + chunk]; }
  // Whether micro-batch i passes through chunk c of rank j.
  bool visits(int micro_batch, int rank, int chunk) const {
    return route_[(size_t)rank * V_ + chunk] == route_of(micro_batch);
  }
  // Where micro-batch i computes stage s.
  const Slot& slot(int micro_batch, int stage) const { return routes_[(size_t)route_of(micro_batch)][(size_t)stage]; }
  // "rank 0: stages 0,3; rank 1: stages 1,2" (for messages and the swimlane).
  std::string describe() const;
  bool operator==(const Placement&) const = default;

 private:
  int p_ = 0, V_ = 0, S_ = 0;
  std::vector<std::vector<Slot>> routes_;
  std::vector<int> stage_, route_;  // per slot j V + c
};

}  // namespace mt::pipeline
