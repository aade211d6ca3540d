#include "report/pipeline_view.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "plan/sim_swimlane.h"
#include "plan/simulator.h"

namespace mt::report {

namespace {

struct Event {
  double t0, t1;  // microseconds
  std::string name, category;
};

std::string ms(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", x);
  return buf;
}

}  // namespace

trace::Swimlane measured_swimlane(const nlohmann::json& trace) {
  std::map<int, std::vector<Event>> by_rank;  // compute track of each rank, by start time
  for (const nlohmann::json& e : trace.value("traceEvents", nlohmann::json::array())) {
    if (!e.is_object() || e.value("ph", "") != "X" || e.value("tid", -1) != 0) continue;
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number()) continue;
    const double ts = e["ts"].get<double>();
    by_rank[e.value("pid", 0)].push_back({ts, ts + e["dur"].get<double>(), e.value("name", ""), e.value("cat", "")});
  }
  trace::Swimlane d;
  double t_start = std::numeric_limits<double>::infinity();
  std::map<int, std::vector<Event>> step;  // each rank's last step
  for (auto& [rank, events] : by_rank) {
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.t0 < b.t0; });
    std::vector<size_t> opt;
    for (size_t i = 0; i < events.size(); i++)
      if (events[i].name == "optimizer step") opt.push_back(i);
    const size_t first = opt.size() >= 2 ? opt[opt.size() - 2] + 1 : 0;
    const size_t last = opt.empty() ? events.size() : opt.back() + 1;
    if (first >= last) continue;
    step[rank].assign(events.begin() + (long)first, events.begin() + (long)last);
    t_start = std::min(t_start, step[rank].front().t0);
  }
  d.title = "Measured pipeline step (the last step in the trace)";
  d.subtitle = "compute track of each rank; hatched: the rank waits (bubble, messages)";
  d.time_label = "time (ms from the step's first computation)";
  d.legend = {{"#4a90d9", "forward"}, {"#dd7a32", "backward"}, {"#9b9b9b", "optimizer and other"}};
  for (const auto& [rank, events] : step) {
    trace::SwimlaneLane lane;
    lane.name = "rank " + std::to_string(rank);
    for (const Event& e : events) {
      const char* fill = e.category == "forward" ? "#4a90d9" : e.category == "backward" ? "#dd7a32" : "#9b9b9b";
      const double a = (e.t0 - t_start) / 1000, b = (e.t1 - t_start) / 1000;
      lane.boxes.push_back({a, b, fill, e.name, e.name + ": " + ms(b - a) + " from " + ms(a)});
    }
    d.lanes.push_back(std::move(lane));
  }
  return d;
}

trace::Swimlane simulated_swimlane(const nlohmann::json& p, const std::string& path) {
  for (const char* key : {"schedule", "stages", "micro_batches", "virtual_stages", "stage_forward_ms",
                          "stage_backward_ms", "message_latency_ms"})
    MT_CHECK_INPUT(p.contains(key), path, ": the \"pipeline\" section has no \"", key,
                   "\" (written by an older meshtrain? rerun with --summary)");
  pipeline::ScheduleSpec spec{p["schedule"].get<std::string>(), p["stages"].get<int>(), p["micro_batches"].get<int>(),
                              p["virtual_stages"].get<int>()};
  plan::CostModel cost;
  cost.stage_forward = p["stage_forward_ms"].get<std::vector<double>>();
  cost.stage_backward = p["stage_backward_ms"].get<std::vector<double>>();
  cost.comm = p["message_latency_ms"].get<double>();
  cost.send = p.value("message_send_ms", 0.0);  // the time of one send / post on its rank (older summaries: free)
  cost.post = p.value("message_post_ms", 0.0);
  if (p.contains("stage_weight_ms") && !p["stage_weight_ms"].empty())  // split schedules' measured weight halves
    cost.stage_weight = p["stage_weight_ms"].get<std::vector<double>>();
  // Per (rank, chunk) where the run measured them (older summaries: per stage only).
  if (p.contains("rank_chunk_forward_ms") && !p["rank_chunk_forward_ms"].empty()) {
    cost.rank_chunk_forward = p["rank_chunk_forward_ms"].get<std::vector<double>>();
    cost.rank_chunk_backward = p.value("rank_chunk_backward_ms", std::vector<double>{});
    cost.rank_chunk_weight = p.value("rank_chunk_weight_ms", std::vector<double>{});
    MT_CHECK_INPUT(cost.rank_chunk_forward.size() == size_t(spec.stages) * spec.virtual_stages &&
                       cost.rank_chunk_backward.size() == cost.rank_chunk_forward.size() &&
                       (cost.rank_chunk_weight.empty() || cost.rank_chunk_weight.size() == cost.rank_chunk_forward.size()),
                   path, ": the \"pipeline\" section has ", cost.rank_chunk_forward.size(), " forward, ",
                   cost.rank_chunk_backward.size(), " backward and ", cost.rank_chunk_weight.size(),
                   " weight (rank, chunk) times for ", spec.stages, " ranks x ", spec.virtual_stages, " chunks");
  }
  const int stages = pipeline::placement_of(spec).stages();  // p V; p under chimera (each stage held twice)
  MT_CHECK_INPUT(cost.stage_forward.size() == size_t(stages) && cost.stage_backward.size() == cost.stage_forward.size(),
                 path, ": the \"pipeline\" section has ", cost.stage_forward.size(), " forward and ",
                 cost.stage_backward.size(), " backward stage times for ", stages, " stages");
  const plan::SimResult r = plan::simulate(spec, cost);
  trace::Swimlane d = plan::swimlane_of(spec, cost, r);
  char sub[224];
  std::snprintf(sub, sizeof sub,
                "simulated from the measured %s times; bubble %.1f%%, message latency %.3f ms, send %.3f ms, "
                "post %.3f ms",
                cost.rank_chunk_forward.empty() ? "stage" : "(rank, chunk)", 100 * r.bubble_fraction, cost.comm, cost.send, cost.post);
  d.subtitle = sub;
  d.time_label = "time (ms, simulated)";
  return d;
}

std::string inline_swimlane_svg(const trace::Swimlane& diagram) {
  std::string s = trace::swimlane_svg(diagram);
  const size_t at = s.find("<svg");
  return at == std::string::npos ? s : s.substr(at);
}

}  // namespace mt::report
