#include "plan/sim_swimlane.h"

#include <cstdio>
#include <string>

#include "core/error.h"

namespace mt::plan {

namespace {

// Shades from dark to light, one per chunk (cycling past 4): chunk 0 is the darkest.
const char* const kForward[] = {"#2b6cb0", "#4a90d9", "#7fb3e6", "#b3d4f2"};
const char* const kBackward[] = {"#b7521b", "#dd7a32", "#eda066", "#f5c59c"};
// The weight-gradient half of a split backward (the input half is drawn as a backward).
const char* const kWeight[] = {"#2f7d32", "#4caf50", "#81c784", "#b9e0bb"};

bool split_backward(const SimResult& r) {
  for (const auto& lane : r.boxes)
    for (const Box& b : lane)
      if (b.kind == pipeline::ActionKind::backward_weight) return true;
  return false;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

}  // namespace

trace::Swimlane swimlane_of(const pipeline::ScheduleSpec& spec, const CostModel& cost, const SimResult& r) {
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  trace::Swimlane d;
  d.title = str(spec.name, " schedule: p = ", p, " stages, m = ", m, " micro-batches",
                V > 1 ? str(", V = ", V, " chunks per rank") : std::string(), "  -  utilization ", pct(r.utilization));
  const std::string ideal = theoretical_bubble_formula(spec);
  d.subtitle = str("bubble ", pct(r.bubble_fraction), " (", ideal, " = ", pct(theoretical_bubble(spec)), "); busy ", num(r.busy), " of ", num(p * r.makespan),
                   "; backward = ", num(cost.backward_ratio), " x forward",
                   split_backward(r) ? str(" (input half ", num(1 - cost.weight_share), ", weight half ",
                                           num(cost.weight_share), " of it)")
                                     : std::string(),
                   "; message cost ", num(cost.comm));
  d.time_label = V > 1 ? str("time (1 = forward of one rank's ", V, " chunks; one chunk takes 1/", V, ")")
                       : std::string("time (1 = forward of one stage)");
  d.end_time = r.makespan;
  for (int c = 0; c < V && c < 4; c++) {
    std::string chunk = V > 1 ? str(", chunk ", c) : std::string();
    d.legend.push_back({kForward[c], "forward" + chunk});
    d.legend.push_back({kBackward[c], (split_backward(r) ? "backward, input half (B)" : "backward") + chunk});
    if (split_backward(r)) d.legend.push_back({kWeight[c], "backward, weight half (W)" + chunk});
  }
  for (int j = 0; j < p; j++) {
    trace::SwimlaneLane lane;
    lane.name = str("rank ", j);
    if (V > 1) {
      lane.name += " (stages ";
      for (int c = 0; c < V; c++) lane.name += str(c ? "," : "", r.placement.stage_of(j, c));
      lane.name += ")";
    }
    for (const Box& b : r.boxes[j]) {
      const bool fwd = b.kind == pipeline::ActionKind::forward, wgt = b.kind == pipeline::ActionKind::backward_weight;
      trace::SwimlaneBox box;
      box.start = b.start;
      box.end = b.end;
      box.fill = (fwd ? kForward : wgt ? kWeight : kBackward)[b.chunk % 4];
      box.label = V > 1 ? str(b.micro_batch, "c", b.chunk) : str(b.micro_batch);
      const char* what = fwd ? "forward"
                         : wgt ? "weight half of the backward"
                         : b.kind == pipeline::ActionKind::backward_input ? "input half of the backward"
                                                                          : "backward";
      box.tooltip = str("rank ", j, ": ", what, " of micro-batch ", b.micro_batch,
                        V > 1 ? str(", chunk ", b.chunk) : std::string(), " (stage ", r.placement.stage_of(j, b.chunk),
                        "), ", num(b.start), " to ", num(b.end));
      lane.boxes.push_back(std::move(box));
    }
    d.lanes.push_back(std::move(lane));
  }
  return d;
}

}  // namespace mt::plan
