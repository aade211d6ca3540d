// The device mesh as arithmetic: named dimensions, a rank's coordinates, and which ranks form each group.
// Pure (no communicator), so every layout can be checked for any world size without starting processes;
// parallel/mesh/mesh.h turns it into communicator groups.
//
// Legend: W world ranks, S parameter servers (async ps only; they hold no model replica), dp x tp x pp the
// worker ranks W - S, d/t/j a worker's dp/tp/pp coordinates.
//
//   world rank = (j * dp + d) * tp + t        tensor-parallel peers adjacent (one host, fastest links),
//                                               then data-parallel, then pipeline; servers are the last S.
//
//   group         members of rank (d, t, j)              rank in the group   used for
//   tp            (d, *, j)                              t                   layer collectives
//   dp            (*, t, j)                              d                   gradient reduction, ZeRO shards
//   pp            (d, t, *)                              j                   activations between stages
//   replica       (d, *, *)                              j * tp + t          one model: files, grad norm
//   tie           (d, t, 0) and (d, t, pp-1), pp > 1     j                   tied embedding's gradient
//                 mirrored: (d, t, j) and (d, t, pp-1-j)                      both copies of a stage (chimera)
//   side          workers or servers                     world rank          parameter-server split
//   ep            (d', t, j) with d' / ep = d / ep       d % ep              MoE token dispatch/combine
//   edp           (d', t, j) with d' % ep = d % ep       d / ep              expert gradients (replicas)
//
// The expert dimension subdivides dp: each data-parallel group is cut into dp / ep runs of ep consecutive
// ranks; a run holds every expert once (parallel/expert). The ranks at the same place of every run hold the
// same experts: their edp group (dp / ep ranks) is where those experts' gradients are reduced.
#pragma once

#include <string>
#include <vector>

namespace mt::parallel {

enum class MeshGroup { tp, dp, pp, replica, tie, side, ep, edp };
constexpr int kMeshGroups = 8;
const char* group_name(MeshGroup g);

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
  bool server = false;  // a parameter server: no model coordinates (all 0)
};

// Membership of one group as seen by one rank: colour (< 0: not a member) and the key that orders it.
struct GroupKey {
  int colour = -1, key = 0;
};

class MeshGrid {
 public:
  // world ranks of which `servers` are parameter servers; dp = 0: the rest / (tp * pp). Throws InputError
  // (naming the flags and the numbers) when the degrees do not tile the worker ranks.
  // ep: the expert-parallel degree, which must divide dp.
  MeshGrid(int world, int dp, int tp, int pp, int servers = 0, int ep = 1);

  int world() const { return world_; }
  int workers() const { return world_ - servers_; }
  int servers() const { return servers_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }

  bool is_server(int world_rank) const { return world_rank >= workers(); }
  MeshCoord coord(int world_rank) const;
  int world_rank(const MeshCoord& c) const;  // c must be a worker's coordinate

  // Whether this layout builds the group at all (a group of one rank everywhere is not built; tp, dp, pp
  // and replica groups exist when their dimension (or tp * pp for dp/replica) exceeds 1; side with servers;
  // ep with ep > 1; edp with ep > 1 and dp / ep > 1).
  bool builds(MeshGroup g) const;
  GroupKey key(MeshGroup g, int world_rank) const;
  // World ranks of world_rank's group g in group-rank order (empty: not a member). O(W).
  std::vector<int> members(MeshGroup g, int world_rank) const;

  // "data-parallel 2 x tensor-parallel 2 x pipeline 2": the dimensions of the layout line the run prints;
  // the notes follow their dimension (" (sequence-parallel)", " (1f1b)").
  std::string describe(const std::string& tp_note = "", const std::string& pp_note = "") const;

  // A bidirectional pipeline (chimera) holds every stage twice, on pipeline ranks j and pp - 1 - j: the tie
  // group then pairs every rank with its mirror (rank 0's pair is still the first and the last stage).
  void set_mirrored(bool on) { mirrored_ = on; }
  bool mirrored() const { return mirrored_; }

 private:
  int world_, servers_, dp_, tp_, pp_, ep_;
  bool mirrored_ = false;
};

}  // namespace mt::parallel
