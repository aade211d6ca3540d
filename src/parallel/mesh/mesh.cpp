#include "parallel/mesh/mesh.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace mt::parallel {

Mesh::Mesh(comm::Communicator* world, const MeshGrid& grid)
    : world_(world), grid_(grid), rank_(world ? world->rank() : 0), coord_(grid.coord(rank_)) {
  MT_ASSERT((world ? world->size() : 1) == grid.world(), "mesh of ", grid.world(), " ranks on a world of ",
            world ? world->size() : 1);
  // Fixed order on every rank: splits are collectives over the world.
  for (MeshGroup g : {MeshGroup::side, MeshGroup::tp, MeshGroup::dp, MeshGroup::replica, MeshGroup::pp,
                      MeshGroup::tie, MeshGroup::ep, MeshGroup::edp}) {
    if (!grid_.builds(g)) continue;
    const GroupKey k = grid_.key(g, rank_);
    const std::string name = g == MeshGroup::side ? (coord_.server ? "ps.servers" : "ps.workers") : group_name(g);
    groups_[(int)g] = world_->split(k.colour, k.key, name);
  }
}

comm::Communicator* Mesh::group(MeshGroup g) const {
  if (comm::Communicator* c = groups_[(int)g].get()) return c;
  if (g != MeshGroup::dp || grid_.builds(MeshGroup::dp) || coord_.server) return nullptr;
  // tp * pp = 1: the workers are the data-parallel group.
  return grid_.builds(MeshGroup::side) ? groups_[(int)MeshGroup::side].get() : world_;
}

void Mesh::sum(MeshGroup g, double* v, int n) const { sum_across(group(g), v, n); }

void sum_across(comm::Communicator* group, double* v, int n) {
  if (!group || group->size() == 1) return;
  std::vector<float> in(v, v + n), out(n);
  group->all_reduce(in.data(), out.data(), n, comm::DType::f32, comm::ReduceOp::sum);
  for (int i = 0; i < n; i++) v[i] = out[i];
}

}  // namespace mt::parallel
