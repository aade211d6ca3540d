// meshtrain.simulate(...): the pipeline simulator of `meshtrain simulate` (plan/simulator.h), its result as a
// Simulation object (attributes, lists per rank, Box objects) instead of printed text.
#include <pybind11/stl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/error.h"
#include "core/fs.h"
#include "parallel/pipeline/schedule.h"
#include "plan/sim_swimlane.h"
#include "plan/simulator.h"
#include "trace/swimlane_svg.h"

namespace mt::py {

namespace {

struct Simulation {
  pipeline::ScheduleSpec spec;
  plan::SimResult result;
  double ideal_bubble = 0;
  std::vector<int> peak_in_flight;  // [rank]: activations held at once (forwards not yet backwarded)
};

const char* kind_name(pipeline::ActionKind k) { return k == pipeline::ActionKind::forward ? "forward" : "backward"; }

Simulation simulate(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                    double backward_ratio, double comm_cost, const std::vector<double>& stage_forward,
                    const std::vector<double>& stage_backward, const std::string& svg) {
  Simulation s;
  s.spec = {schedule, stages, micro_batches, virtual_stages};
  plan::CostModel cost;
  cost.backward_ratio = backward_ratio;
  cost.comm = comm_cost;
  cost.stage_forward = stage_forward;
  cost.stage_backward = stage_backward;
  const size_t n = size_t(std::max(stages, 0)) * size_t(std::max(virtual_stages, 0));
  MT_CHECK_INPUT(stage_forward.size() == stage_backward.size() && (stage_forward.empty() || stage_forward.size() == n),
                 "simulate(): stage_forward and stage_backward must both be empty or have stages x virtual_stages = ",
                 n, " entries, got ", stage_forward.size(), " and ", stage_backward.size());
  const pipeline::Schedule lists = pipeline::make_schedule(s.spec);  // InputError for a bad spec
  s.result = plan::simulate(s.spec, lists, cost);                    // InputError for a bad cost model
  s.ideal_bubble = plan::theoretical_bubble(s.spec);
  for (size_t j = 0; j < lists.size(); j++) s.peak_in_flight.push_back(pipeline::peak_in_flight(lists[j]));
  if (!svg.empty()) write_file_atomic(svg, trace::swimlane_svg(plan::swimlane_of(s.spec, cost, s.result)));
  return s;
}

}  // namespace

void add_simulate(pb::module_& m) {
  pb::class_<plan::Box>(m, "Box", "one computation as simulated: [start, end) on its rank")
      .def_readonly("start", &plan::Box::start)
      .def_readonly("end", &plan::Box::end)
      .def_property_readonly("kind", [](const plan::Box& b) { return kind_name(b.kind); })
      .def_readonly("micro_batch", &plan::Box::micro_batch)
      .def_readonly("chunk", &plan::Box::chunk)
      .def("__repr__", [](const plan::Box& b) {
        return str("Box(", kind_name(b.kind), " micro_batch=", b.micro_batch, " chunk=", b.chunk, " [", b.start, ", ",
                   b.end, "))");
      });
  pb::class_<Simulation>(m, "Simulation", "a pipeline schedule replayed under the simulator's cost model")
      .def_property_readonly("schedule", [](const Simulation& s) { return s.spec.name; })
      .def_property_readonly("stages", [](const Simulation& s) { return s.spec.stages; })
      .def_property_readonly("micro_batches", [](const Simulation& s) { return s.spec.micro_batches; })
      .def_property_readonly("virtual_stages", [](const Simulation& s) { return s.spec.virtual_stages; })
      .def_property_readonly("makespan", [](const Simulation& s) { return s.result.makespan; })
      .def_property_readonly("busy", [](const Simulation& s) { return s.result.busy; })
      .def_property_readonly("utilization", [](const Simulation& s) { return s.result.utilization; })
      .def_property_readonly("bubble_fraction", [](const Simulation& s) { return s.result.bubble_fraction; })
      .def_readonly("ideal_bubble", &Simulation::ideal_bubble,
                    "(p - 1) / (V m + p - 1); chimera (p - 2) / (2m + p - 2); zb-h1, zb-h2 (p - 1) / (3m + p - 1) and "
                    "zb-v (p - 1) / (6m + p - 1), the least any list reaches at F = B = W with the step's ranks "
                    "starting together")
      .def_property_readonly("busy_per_rank", [](const Simulation& s) { return s.result.busy_per_rank; })
      .def_property_readonly("finish", [](const Simulation& s) { return s.result.finish; })
      .def_readonly("peak_in_flight", &Simulation::peak_in_flight)
      .def_property_readonly(
          "boxes", [](const Simulation& s) { return s.result.boxes; }, "[rank][n]: Box in list order")
      .def("__repr__", [](const Simulation& s) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "makespan=%.4g utilization=%.4f bubble_fraction=%.4f ideal_bubble=%.4f)",
                      s.result.makespan, s.result.utilization, s.result.bubble_fraction, s.ideal_bubble);
        return str("Simulation(", s.spec.name, " p=", s.spec.stages, " m=", s.spec.micro_batches,
                   " V=", s.spec.virtual_stages, " ", buf);
      });
  m.def("simulate", &simulate, pb::arg("schedule"), pb::arg("stages"), pb::arg("micro_batches"),
        pb::arg("virtual_stages") = 1, pb::arg("backward_ratio") = 2.0, pb::arg("comm_cost") = 0.0,
        pb::arg("stage_forward") = std::vector<double>{}, pb::arg("stage_backward") = std::vector<double>{},
        pb::arg("svg") = std::string(),
        ("`meshtrain simulate`: replay a pipeline schedule (" + pipeline::schedule_names_joined() +
         ") of `stages` ranks and `micro_batches` under the cost model (forward 1 per rank, backward backward_ratio "
         "(a split backward's input and weight halves 1/2 each), message comm_cost; or measured per-stage times in "
         "ms); returns a Simulation; svg: also write the swimlane there")
            .c_str());
}

}  // namespace mt::py
