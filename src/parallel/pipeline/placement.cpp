#include "parallel/pipeline/placement.h"

#include "core/error.h"

namespace mt::pipeline {

Placement::Placement(int ranks, int chunks, std::vector<std::vector<Slot>> routes)
    : p_(ranks), V_(chunks), routes_(std::move(routes)) {
  MT_CHECK_INPUT(p_ >= 1 && V_ >= 1, "placement: ranks and chunks must be at least 1, got ", p_, " and ", V_);
  MT_CHECK_INPUT(!routes_.empty() && !routes_[0].empty(), "placement: no route, or a route of no stages");
  S_ = (int)routes_[0].size();
  stage_.assign((size_t)p_ * V_, -1);
  route_.assign((size_t)p_ * V_, -1);
  for (size_t r = 0; r < routes_.size(); r++) {
    MT_CHECK_INPUT((int)routes_[r].size() == S_, "placement: route ", r, " has ", routes_[r].size(),
                   " stages, route 0 has ", S_);
    for (int s = 0; s < S_; s++) {
      const Slot& x = routes_[r][s];
      MT_CHECK_INPUT(x.rank >= 0 && x.rank < p_ && x.chunk >= 0 && x.chunk < V_, "placement: route ", r, " stage ", s,
                     " on rank ", x.rank, " chunk ", x.chunk, ", outside ", p_, " ranks x ", V_, " chunks");
      const size_t k = (size_t)x.rank * V_ + x.chunk;
      MT_CHECK_INPUT(stage_[k] < 0, "placement: rank ", x.rank, " chunk ", x.chunk, " holds two stages (", stage_[k],
                     " on route ", route_[k], " and ", s, " on route ", r, ")");
      stage_[k] = s;
      route_[k] = (int)r;
    }
  }
  for (int j = 0; j < p_; j++)
    for (int c = 0; c < V_; c++)
      MT_CHECK_INPUT(stage_[(size_t)j * V_ + c] >= 0, "placement: rank ", j, " chunk ", c, " holds no stage");
}

Placement Placement::looped(int ranks, int chunks) {
  std::vector<Slot> route;
  for (int c = 0; c < chunks; c++)
    for (int j = 0; j < ranks; j++) route.push_back({j, c});  // stage c p + j
  return Placement(ranks, chunks, {route});
}

std::string Placement::describe() const {
  std::string out;
  for (int j = 0; j < p_; j++) {
    out += str(j ? "; " : "", "rank ", j, ": stage", V_ > 1 ? "s " : " ");
    for (int c = 0; c < V_; c++) out += str(c ? "," : "", stage_of(j, c));
  }
  return out;
}

}  // namespace mt::pipeline
