// The pipeline bubble of a real run: measured from the ranks' executor timings (pipeline::PipelineStats),
// and simulated (plan::simulate) for the same schedule with each (rank, chunk)'s measured forward and backward
// time (each stage's mean over the ranks holding it when a rank did not measure its chunks),
// the measured message latency and the measured time of one send and one post on their rank, so the two can
// be compared; plus the ideal (p - 1) / (V m + p - 1).
//
//   measured   1 - sum over ranks of compute / (p x the longest rank's span), over the timed lists
//   simulated  the simulator's bubble fraction under those per-(rank, chunk) costs, message latency and send / post
//              times (cost.comm, cost.send, cost.post: means over all ranks and messages); a split
//              backward's input and weight halves each take their own measured time per stage
//   simulated_free_messages  the same without latency and with free sends and posts
//   simulated_free_calls     with the latency, sends and posts free (the figure before they were measured)
//   simulated_stage_means  the same with each stage's mean over the ranks holding it for every holder (the
//              figure before per-(rank, chunk) times; differs only where a stage has two holders: chimera); -1
//              when no per-(rank, chunk) times were measured
//   simulated_half_split  (split schedules only) the same with each stage's backward split in halves by
//              assumption instead, for comparison; -1 otherwise
#pragma once

#include <vector>

#include "parallel/pipeline/stats.h"
#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"

namespace mt::plan {

// A rank's stats as floats (ms and counts), for gathering with one all_gather: packed_size(V) floats.
size_t packed_size(int virtual_stages);
void pack(const pipeline::PipelineStats& st, int virtual_stages, float* out);
pipeline::PipelineStats unpack(const float* in, int virtual_stages);

struct BubbleReport {
  double measured = -1, simulated = -1, simulated_free_messages = -1, ideal = -1, simulated_half_split = -1;
  double simulated_free_calls = -1;
  double simulated_stage_means = -1;
  CostModel cost;  // per stage (the mean over its holders) and per (rank, chunk), per micro-batch (ms); comm = the mean message latency, send / post their mean (ms)
};

// ranks[j]: pipeline rank j's stats, each accumulated over the same number of lists (steps). same_clock: the
// ranks' clocks are comparable (one host), so message latencies are meaningful. Empty report (-1) when no
// list was timed.
BubbleReport bubble_report(const pipeline::ScheduleSpec& spec, const std::vector<pipeline::PipelineStats>& ranks,
                           bool same_clock);

}  // namespace mt::plan
