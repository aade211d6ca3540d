// The pipeline part of the report: swimlanes (trace/swimlane_svg.h) of one step, measured from a run's
// Chrome trace and simulated (plan/simulator.h) from the stage times its summary measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "trace/swimlane_svg.h"

namespace mt::report {

// The last whole step of a --trace file: one lane per rank (pid), its compute-track events (tid 0) from the
// end of the rank's second-to-last "optimizer step" event to the end of its last, in ms from the earliest
// of those events over all ranks. Forwards blue, backwards orange, anything else grey. No lanes when the
// trace has no compute events.
trace::Swimlane measured_swimlane(const nlohmann::json& trace);

// The simulated step for a summary's "pipeline" section (schedule, stages, micro_batches, virtual_stages,
// stage_forward_ms, stage_backward_ms, message_latency_ms). Throws mt::InputError naming `path` when a field
// is missing or the schedule is one the simulator cannot build.
trace::Swimlane simulated_swimlane(const nlohmann::json& pipeline, const std::string& path);

// swimlane_svg without its XML declaration, to sit inside HTML.
std::string inline_swimlane_svg(const trace::Swimlane& diagram);

}  // namespace mt::report
