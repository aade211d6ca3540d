// A simulated pipeline step (plan/simulator.h) as a swimlane diagram (trace/swimlane_svg.h): one lane per
// rank, forwards in blues and backwards in oranges, a lighter shade per later chunk, each box labelled with
// its micro-batch ("3") or micro-batch and chunk ("3c1") when V > 1; the title carries the schedule, p, m,
// V and the utilization.
#pragma once

#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"
#include "trace/swimlane_svg.h"

namespace mt::plan {

trace::Swimlane swimlane_of(const pipeline::ScheduleSpec& spec, const CostModel& cost, const SimResult& result);

}  // namespace mt::plan
