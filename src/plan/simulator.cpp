#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::plan {

using pipeline::Action;
using pipeline::ActionKind;

SimResult simulate(const pipeline::ScheduleSpec& spec, const pipeline::Schedule& schedule, const CostModel& cost) {
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  MT_CHECK_INPUT(finite_nonneg(cost.forward) && cost.forward > 0, "simulator: forward time must be > 0, got ",
                 cost.forward);
  MT_CHECK_INPUT(finite_nonneg(cost.backward_ratio), "simulator: backward ratio must be >= 0, got ",
                 cost.backward_ratio);
  MT_CHECK_INPUT(finite_nonneg(cost.comm), "simulator: message cost must be >= 0, got ", cost.comm);
  MT_CHECK_INPUT(finite_nonneg(cost.send) && finite_nonneg(cost.post),
                 "simulator: a send's and a post's time must be >= 0, got ", cost.send, " and ", cost.post);
  MT_CHECK_INPUT(finite_nonneg(cost.weight_share) && cost.weight_share <= 1,
                 "simulator: the weight half's share of a split backward must be in [0, 1], got ", cost.weight_share);
  pipeline::check_schedule(spec, schedule);

  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  const pipeline::Placement& pl = schedule.placement;
  const int S = pl.stages();
  MT_CHECK_INPUT(cost.stage_forward.empty() || (int)cost.stage_forward.size() == S,
                 "simulator: stage_forward has ", cost.stage_forward.size(), " entries for ", S, " stages");
  MT_CHECK_INPUT(cost.stage_backward.size() == cost.stage_forward.size(), "simulator: stage_backward has ",
                 cost.stage_backward.size(), " entries, stage_forward ", cost.stage_forward.size());
  for (size_t s = 0; s < cost.stage_forward.size(); s++)
    MT_CHECK_INPUT(finite_nonneg(cost.stage_forward[s]) && finite_nonneg(cost.stage_backward[s]),
                   "simulator: stage ", s, " has a negative or non-finite forward or backward time");
  MT_CHECK_INPUT(cost.stage_weight.empty() || cost.stage_weight.size() == cost.stage_forward.size(),
                 "simulator: stage_weight has ", cost.stage_weight.size(), " entries, stage_forward ",
                 cost.stage_forward.size(), " (per-stage weight halves need per-stage times)");
  for (size_t s = 0; s < cost.stage_weight.size(); s++)
    MT_CHECK_INPUT(finite_nonneg(cost.stage_weight[s]) &&
                       cost.stage_weight[s] <= cost.stage_backward[s] * (1 + 1e-6) + 1e-12,
                   "simulator: stage ", s, "'s weight half ", cost.stage_weight[s],
                   " is negative, non-finite or longer than its whole backward ", cost.stage_backward[s]);
  const size_t boxes = (size_t)p * V;
  MT_CHECK_INPUT(cost.rank_chunk_forward.empty() || cost.rank_chunk_forward.size() == boxes,
                 "simulator: rank_chunk_forward has ", cost.rank_chunk_forward.size(), " entries for ", p,
                 " ranks x ", V, " chunks");
  MT_CHECK_INPUT(cost.rank_chunk_backward.size() == cost.rank_chunk_forward.size(),
                 "simulator: rank_chunk_backward has ", cost.rank_chunk_backward.size(), " entries, rank_chunk_forward ",
                 cost.rank_chunk_forward.size());
  MT_CHECK_INPUT(cost.rank_chunk_weight.empty() || cost.rank_chunk_weight.size() == cost.rank_chunk_forward.size(),
                 "simulator: rank_chunk_weight has ", cost.rank_chunk_weight.size(), " entries, rank_chunk_forward ",
                 cost.rank_chunk_forward.size(), " (per-(rank, chunk) weight halves need per-(rank, chunk) times)");
  for (size_t k = 0; k < cost.rank_chunk_forward.size(); k++) {
    MT_CHECK_INPUT(finite_nonneg(cost.rank_chunk_forward[k]) && finite_nonneg(cost.rank_chunk_backward[k]),
                   "simulator: rank ", k / V, " chunk ", k % V, " has a negative or non-finite forward or backward time");
    if (!cost.rank_chunk_weight.empty())
      MT_CHECK_INPUT(finite_nonneg(cost.rank_chunk_weight[k]) &&
                         cost.rank_chunk_weight[k] <= cost.rank_chunk_backward[k] * (1 + 1e-6) + 1e-12,
                     "simulator: rank ", k / V, " chunk ", k % V, "'s weight half ", cost.rank_chunk_weight[k],
                     " is negative, non-finite or longer than its whole backward ", cost.rank_chunk_backward[k]);
  }
  const bool per_box = !cost.rank_chunk_forward.empty();
  auto box = [&](int rank, int chunk) { return (size_t)rank * V + chunk; };
  // A rank's share of one model is V / R chunks (R routes: chimera holds each stage twice, so its chunk is a
  // whole stage and F the forward of one stage, as under 1F1B).
  const double per_chunk = (double)pl.routes() / V;
  // Per (rank, chunk) when given, else per stage when given, else the nominal model.
  auto t_fwd_of = [&](int rank, int chunk) {
    if (per_box) return cost.rank_chunk_forward[box(rank, chunk)];
    return cost.stage_forward.empty() ? cost.forward * per_chunk : cost.stage_forward[pl.stage_of(rank, chunk)];
  };
  auto t_bwd_of = [&](int rank, int chunk) {
    if (per_box) return cost.rank_chunk_backward[box(rank, chunk)];
    return cost.stage_forward.empty() ? cost.backward_ratio * cost.forward * per_chunk
                                      : cost.stage_backward[pl.stage_of(rank, chunk)];
  };

  // The halves of a split backward: measured per (rank, chunk) or per stage when given, else the share w of the
  // whole.
  const bool measured_weight = (per_box && !cost.rank_chunk_weight.empty()) || !cost.stage_weight.empty();
  auto t_weight_of = [&](int rank, int chunk) {
    if (per_box && !cost.rank_chunk_weight.empty())
      return std::min(cost.rank_chunk_weight[box(rank, chunk)], t_bwd_of(rank, chunk));
    return cost.stage_weight.empty() ? cost.weight_share * t_bwd_of(rank, chunk)
                                     : std::min(cost.stage_weight[pl.stage_of(rank, chunk)], t_bwd_of(rank, chunk));
  };

  auto t_input_of = [&](int rank, int chunk) {
    return !measured_weight ? (1 - cost.weight_share) * t_bwd_of(rank, chunk)
                            : t_bwd_of(rank, chunk) - t_weight_of(rank, chunk);
  };

  // When each message was sent and when its receive was posted; indexed by message, NaN until it happens.
  // A message is named by its sender's end: (grad, i, from_stage).
  const double unset = std::numeric_limits<double>::quiet_NaN();
  const size_t n_msgs = (size_t)2 * m * S;
  std::vector<double> sent_at(n_msgs, unset), posted_at(n_msgs, unset);
  auto slot = [&](const pipeline::Message& msg) {
    return ((size_t)msg.micro_batch * S + msg.from_stage) * 2 + (msg.grad ? 1 : 0);
  };

  SimResult r;
  r.placement = pl;
  r.boxes.resize(p);
  r.finish.assign(p, 0.0);
  r.busy_per_rank.assign(p, 0.0);
  std::vector<size_t> pc((size_t)p, 0);
  // Each rank runs until it waits for a message not sent yet; sends never wait, so sweeping the ranks until
  // none moves replays everything (check_schedule has shown that it ends).
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      double& t = r.finish[j];
      for (; pc[j] < schedule[j].size(); pc[j]++) {
        const Action& a = schedule[j][pc[j]];
        if (pipeline::is_compute(a.kind)) {
          const double d = a.kind == ActionKind::forward          ? t_fwd_of(j, a.chunk)
                           : a.kind == ActionKind::backward       ? t_bwd_of(j, a.chunk)
                           : a.kind == ActionKind::backward_input ? t_input_of(j, a.chunk)
                                                                  : t_weight_of(j, a.chunk);
          r.boxes[j].push_back({t, t + d, a.kind, a.micro_batch, a.chunk});
          r.busy_per_rank[j] += d;
          t += d;
        } else if (pipeline::is_send(a.kind)) {
          t += cost.send;
          sent_at[slot(pipeline::message_of(a, j, pl))] = t;
        } else if (pipeline::is_post(a.kind)) {
          posted_at[slot(pipeline::message_of(a, j, pl))] = t;
          t += cost.post;
        } else if (pipeline::is_wait(a.kind)) {
          const size_t s = slot(pipeline::message_of(a, j, pl));
          if (std::isnan(sent_at[s])) break;
          t = std::max(t, std::max(sent_at[s], posted_at[s]) + cost.comm);
        }
        progress = true;
      }
    }
  }
  for (int j = 0; j < p; j++) {
    MT_ASSERT(pc[j] == schedule[j].size(), "rank ", j, " stuck at action ", pc[j], " after check_schedule passed");
    r.makespan = std::max(r.makespan, r.finish[j]);
    r.busy += r.busy_per_rank[j];
  }
  r.utilization = r.makespan > 0 ? r.busy / (p * r.makespan) : 1.0;
  r.bubble_fraction = 1.0 - r.utilization;
  return r;
}

SimResult simulate(const pipeline::ScheduleSpec& spec, const CostModel& cost) {
  return simulate(spec, pipeline::make_schedule(spec), cost);
}

namespace {
bool one_chunk_zero_bubble(const std::string& name) { return name == "zb-h1" || name == "zb-h2"; }
}  // namespace

double theoretical_bubble(const pipeline::ScheduleSpec& spec) {
  const double p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  if (pipeline::placement_of(spec).routes() == 2) return (p - 2) / (2 * m + p - 2);  // chimera
  if (one_chunk_zero_bubble(spec.name)) return (p - 1) / (3 * m + p - 1);
  if (spec.name == "zb-v") return (p - 1) / (6 * m + p - 1);
  return (p - 1) / (V * m + p - 1);
}

std::string theoretical_bubble_formula(const pipeline::ScheduleSpec& spec) {
  if (pipeline::placement_of(spec).routes() == 2) return "Chimera's (p-2)/(2m+p-2), F = B";
  if (one_chunk_zero_bubble(spec.name)) return "zero-bubble bound (p-1)/(3m+p-1), F = B = W";
  if (spec.name == "zb-v") return "zero-bubble bound (p-1)/(6m+p-1), F = B = W";
  return spec.virtual_stages > 1 ? "ideal (p-1)/(Vm+p-1)" : "ideal (p-1)/(m+p-1)";
}

}  // namespace mt::plan
