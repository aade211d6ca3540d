#include "parallel/mesh/grid.h"

#include <algorithm>

#include "core/error.h"

namespace mt::parallel {

const char* group_name(MeshGroup g) {
  switch (g) {
    case MeshGroup::tp: return "tp";
    case MeshGroup::dp: return "dp";
    case MeshGroup::pp: return "pp";
    case MeshGroup::replica: return "mp";
    case MeshGroup::tie: return "tie";
    case MeshGroup::side: return "ps";
    case MeshGroup::ep: return "ep";
    case MeshGroup::edp: return "edp";
  }
  return "?";
}

MeshGrid::MeshGrid(int world, int dp, int tp, int pp, int servers, int ep)
    : world_(world), servers_(servers), tp_(tp), pp_(pp), ep_(ep) {
  MT_CHECK_INPUT(tp >= 1 && pp >= 1 && dp >= 0 && servers >= 0, "mesh degrees must be positive: --dp ", dp,
                 " --tp ", tp, " --pp ", pp, " --servers ", servers);
  const int w = world - servers;
  MT_CHECK_INPUT(w >= 1, "the mesh needs at least one worker rank besides the ", servers, " server(s): ", world,
                 " ranks are too few");
  MT_CHECK_INPUT(w % (tp * pp) == 0, "the number of ranks (", world, ": --nproc or mpirun -np) is ",
                 "not divisible by --tp ", tp, " x --pp ", pp);
  dp_ = dp == 0 ? w / (tp * pp) : dp;
  MT_CHECK_INPUT(dp_ * tp * pp == w, "--dp ", dp_, " x --tp ", tp, " x --pp ", pp, " must equal the number of ",
                 servers > 0 ? "workers (ranks minus --servers): " : "ranks (--nproc or mpirun -np): ", w);
  MT_CHECK_INPUT(ep >= 1 && dp_ % ep == 0, "--ep ", ep, " does not divide the data-parallel degree ", dp_,
                 ": experts are split over ep ranks of each data-parallel group");
}

MeshCoord MeshGrid::coord(int r) const {
  MT_ASSERT(r >= 0 && r < world_, "rank ", r, " outside the mesh of ", world_);
  if (is_server(r)) return {0, 0, 0, true};
  return {(r / tp_) % dp_, r % tp_, r / (tp_ * dp_), false};
}

int MeshGrid::world_rank(const MeshCoord& c) const { return (c.pp * dp_ + c.dp) * tp_ + c.tp; }

bool MeshGrid::builds(MeshGroup g) const {
  switch (g) {
    case MeshGroup::tp: return tp_ > 1;
    case MeshGroup::dp:
    case MeshGroup::replica: return tp_ * pp_ > 1;  // else the data-parallel group is the worker group
    case MeshGroup::pp:
    case MeshGroup::tie: return pp_ > 1;
    case MeshGroup::side: return servers_ > 0;
    case MeshGroup::ep: return ep_ > 1;
    case MeshGroup::edp: return ep_ > 1 && dp_ / ep_ > 1;
  }
  return false;
}

GroupKey MeshGrid::key(MeshGroup g, int r) const {
  const MeshCoord c = coord(r);
  if (g == MeshGroup::side) return {c.server ? 1 : 0, r};
  if (c.server) return {};
  switch (g) {
    case MeshGroup::tp: return {r / tp_, c.tp};
    case MeshGroup::dp: return {c.pp * tp_ + c.tp, c.dp};
    case MeshGroup::pp: return {c.dp * tp_ + c.tp, c.pp};
    case MeshGroup::replica: return {c.dp, c.pp * tp_ + c.tp};
    case MeshGroup::tie:
      if (mirrored_) return {(c.dp * tp_ + c.tp) * pp_ + std::min(c.pp, pp_ - 1 - c.pp), c.pp};
      return {c.pp == 0 || c.pp == pp_ - 1 ? c.dp * tp_ + c.tp : -1, c.pp};
    case MeshGroup::ep: return {(c.pp * tp_ + c.tp) * (dp_ / ep_) + c.dp / ep_, c.dp % ep_};
    case MeshGroup::edp: return {(c.pp * tp_ + c.tp) * ep_ + c.dp % ep_, c.dp / ep_};
    case MeshGroup::side: break;
  }
  return {};
}

std::vector<int> MeshGrid::members(MeshGroup g, int r) const {
  const GroupKey mine = key(g, r);
  std::vector<int> out;
  if (mine.colour < 0) return out;
  std::vector<std::pair<int, int>> keyed;  // (key, world rank): split's order
  for (int q = 0; q < world_; q++) {
    const GroupKey k = key(g, q);
    if (k.colour == mine.colour) keyed.push_back({k.key, q});
  }
  std::sort(keyed.begin(), keyed.end());
  for (auto& [k, q] : keyed) out.push_back(q);
  return out;
}

std::string MeshGrid::describe(const std::string& tp_note, const std::string& pp_note) const {
  return str("data-parallel ", dp_, ep_ > 1 ? str(" (expert-parallel ", ep_, ")") : "", " x tensor-parallel ", tp_,
             tp_note, " x pipeline ", pp_, pp_note);
}

}  // namespace mt::parallel
