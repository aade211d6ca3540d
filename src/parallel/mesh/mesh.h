// The device mesh of one run: its grid (parallel/mesh/grid.h) and every sub-group, split from the world
// communicator once, in one fixed order, when the run starts. Passed around as a value; nothing reads a
// global. A group the layout does not need is null, except dp, which falls back to the worker group (the
// world without parameter servers) when tp * pp = 1.
//
// Cost: one split (a collective over the world) per built group, at construction only.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "parallel/mesh/grid.h"

namespace mt::parallel {

class Mesh {
 public:
  // world null: one process (the grid must then be 1 x 1 x 1). Collective over world.
  Mesh(comm::Communicator* world, const MeshGrid& grid);

  const MeshGrid& grid() const { return grid_; }
  comm::Communicator* world() const { return world_; }
  int world_rank() const { return rank_; }
  const MeshCoord& coord() const { return coord_; }
  bool server() const { return coord_.server; }
  bool lead() const { return rank_ == 0; }

  // The group of this rank (null when not built or not a member; dp: see above; a server's dp is null).
  comm::Communicator* group(MeshGroup g) const;
  comm::Communicator* dp() const { return group(MeshGroup::dp); }
  comm::Communicator* tp() const { return group(MeshGroup::tp); }
  comm::Communicator* pp() const { return group(MeshGroup::pp); }
  comm::Communicator* replica() const { return group(MeshGroup::replica); }
  comm::Communicator* ep() const { return group(MeshGroup::ep); }
  comm::Communicator* edp() const { return group(MeshGroup::edp); }

  // Sums a few doubles over group g (as float32, what comm reduces); no-op without the group.
  void sum(MeshGroup g, double* v, int n) const;

 private:
  comm::Communicator* world_;
  MeshGrid grid_;
  int rank_ = 0;
  MeshCoord coord_;
  std::unique_ptr<comm::Communicator> groups_[kMeshGroups];
};

// Sums a few doubles across `group` as float32 (no-op for null or one rank).
void sum_across(comm::Communicator* group, double* v, int n);

}  // namespace mt::parallel
