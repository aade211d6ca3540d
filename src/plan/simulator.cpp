#include "plan/simulator.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace mt::plan {

using pipeline::Action;
using pipeline::ActionKind;

Simulation simulate(const pipeline::ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                    const CostModel& cost) {
  const int p = spec.stages, V = spec.virtual_stages;
  const double fwd = cost.forward / V, bwd = fwd * cost.backward_ratio;
  Simulation sim;
  sim.ranks = p;
  std::vector<double> clock(p, 0.0);
  std::vector<size_t> pc(p, 0);
  // (is_grad, micro-batch, receiving global stage) -> arrival time
  std::map<std::tuple<bool, int, int>, double> arrivals;
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < p; j++) {
      for (; pc[j] < lists[j].size(); pc[j]++) {
        const Action& a = lists[j][pc[j]];
        const int s = a.chunk * p + j;
        if (a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad) {
          bool grad = a.kind == ActionKind::send_grad;
          arrivals[{grad, a.micro_batch, grad ? s - 1 : s + 1}] = clock[j] + cost.comm;
        } else if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) {
          auto it = arrivals.find({a.kind == ActionKind::recv_grad, a.micro_batch, s});
          if (it == arrivals.end()) break;  // its sender has not got there yet
          clock[j] = std::max(clock[j], it->second);
          arrivals.erase(it);
        } else {
          double d = a.kind == ActionKind::forward ? fwd : bwd;
          sim.boxes.push_back({j, a.kind, a.micro_batch, a.chunk, clock[j], clock[j] + d});
          clock[j] += d;
          sim.busy += d;
        }
        progress = true;
      }
    }
  }
  for (int j = 0; j < p; j++)
    MT_REQUIRE(Error, pc[j] == lists[j].size(), "simulation deadlocked: rank ", j, " stopped at action ", pc[j]);
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  sim.utilization = sim.makespan > 0 ? sim.busy / (p * sim.makespan) : 1.0;
  sim.bubble = 1.0 - sim.utilization;
  return sim;
}

}  // namespace mt::plan
