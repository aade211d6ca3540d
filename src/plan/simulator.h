// The pipeline simulator: replays the per-rank action lists of parallel/pipeline/schedule.h under a cost
// model and reports when each computation runs, the makespan, utilization and bubble. The same lists the
// executor runs, so the simulated bubble is the one a real run should approach. No threads, no clocks.
//
// Legend: p ranks, m micro-batches, V chunks per rank, S = p V stages, F the forward time of one rank's
// share of the model (all its chunks), R the backward / forward ratio, C the cost of one message.
//
// Cost model, in units of F (the defaults give the textbook cells: forward 1, backward 2 when V = 1):
//   forward of one chunk   F K / V         (a rank's layers are split evenly over its V chunks; K the placement's
//                                          routes, 1 but for chimera's 2: its chunk is a whole stage, F its forward)
//   backward of one chunk  R F K / V; split in two (zero-bubble schedules): its input half (B, "I") takes
//                          (1 - w) R F / V and its weight half (W) w R F / V, w the weight share (default 1/2:
//                          with R = 2, F = B = W = 1 unit, the zero-bubble papers' assumption). Under measured
//                          stage times, stage_weight (measured too) splits each stage's backward as it ran;
//                          without it the same share w splits it (an assumption, not a measurement).
//   send                   `send` on the sender (default 0: it goes on at once), the message issued at its end
//   post                   `post` on the receiver (default 0), the receive posted at its start
//   message                arrives C after both its send is issued and its receive posted (a rendezvous:
//                          what shm and MPI do for large tensors; with C = 0 the posting time does not matter)
//   wait                   ends at the later of "now" and the arrival
//   optimizer_step         0
// A send's or post's time is not compute: it counts in the bubble, as in the executor's measured one.
// Utilization = busy compute time over all ranks / (p * makespan); bubble fraction = 1 - utilization.
// For gpipe and 1f1b with C = 0 this gives exactly (p - 1) / (m + p - 1) bubble; for interleaved the
// textbook estimate is (p - 1) / (V m + p - 1) (theoretical_bubble).
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::plan {

struct CostModel {
  double forward = 1.0;         // F: forward of one rank's share of the model; one chunk takes F / V
  double backward_ratio = 2.0;  // R: backward = R * forward
  double comm = 0.0;            // C: one activation or gradient message, posted and sent -> arrived
  double weight_share = 0.5;    // w: the weight-gradient half's share of a split backward (input half: 1 - w)
  // Optional, measured: per global stage s (p V entries), the forward and backward time of one micro-batch
  // through that stage; when given they replace forward and backward_ratio (stages of unequal cost, e.g. the
  // last one with the logits, or ranks slowed by others).
  std::vector<double> stage_forward{}, stage_backward{};
  // Optional, measured, only with stage_forward: per global stage the weight half (W) of one micro-batch's split
  // backward through that stage, a part of stage_backward (the input half I takes the rest); replaces
  // weight_share. Must lie in [0, stage_backward] (a rounding excess of up to 1e-6 relative is clamped).
  std::vector<double> stage_weight{};
  // Optional, measured: per (rank, chunk), index rank * V + chunk (p V entries), the forward, backward and (split
  // schedules) weight half of one micro-batch through that rank's chunk, as that rank took them. When given they
  // replace the per-stage times for that box: under chimera a stage is held by two ranks (one per route) that may
  // run at different speeds, which one mean per stage hides. rank_chunk_weight needs rank_chunk_forward; without
  // it a split backward's weight half comes from stage_weight (clamped to the rank's backward) or the share w.
  std::vector<double> rank_chunk_forward{}, rank_chunk_backward{}, rank_chunk_weight{};
  // The time one send (copy and isend) and one receive post (irecv) take on their own rank, computing nothing;
  // a real run's are the executor's measured means (PipelineStats send_us / sends, post_us / posts).
  double send = 0.0, post = 0.0;
};

// One computation as it ran: [start, end) on its rank.
struct Box {
  double start = 0, end = 0;
  pipeline::ActionKind kind = pipeline::ActionKind::forward;  // forward, backward, backward_input or _weight
  int micro_batch = -1;
  int chunk = -1;
};

struct SimResult {
  pipeline::Placement placement;        // the schedule's: which stage each (rank, chunk) box computes
  std::vector<std::vector<Box>> boxes;  // [rank][n]: compute boxes in list order
  std::vector<double> finish;           // [rank]: when the rank's last action ends
  std::vector<double> busy_per_rank;    // [rank]: summed box lengths
  double makespan = 0;                  // max of finish
  double busy = 0;                      // summed over ranks
  double utilization = 0;               // busy / (p * makespan)
  double bubble_fraction = 0;           // 1 - utilization
};

// Replays `schedule` (checked first with check_schedule, so a broken list throws ScheduleError).
// Throws mt::InputError for a cost model with negative or non-finite times, F = 0 or w outside [0, 1].
SimResult simulate(const pipeline::ScheduleSpec& spec, const pipeline::Schedule& schedule, const CostModel& cost);
// make_schedule(spec), then the above.
SimResult simulate(const pipeline::ScheduleSpec& spec, const CostModel& cost = {});

// (p - 1) / (V m + p - 1): the bubble of an ideal pipeline with m V equal units per rank, p - 1 of them idle at
// each end; (p - 1) / (m + p - 1) for V = 1. For a placement of two routes (chimera) the Chimera paper's
// (p - 2) / (2m + p - 2), which its order reaches with F = B when m is a multiple of p.
// The zero-bubble schedules (split backward) at F = B = W (backward 2 x forward, equal halves), with the ranks
// starting the step together: rank p - 1 cannot start before the p - 1 forwards ahead of it (zb-v: p - 1 chunk
// forwards of F / 2) and then has m (F + B + W) = 3m F to do, so no list ends before (p - 1) F + 3m F
// (zb-v (p - 1) F / 2 + 3m F): bubble (p - 1) / (3m + p - 1), zb-v (p - 1) / (6m + p - 1), a lower bound.
// ZB-H1 reaches it for m >= p (its (p - 1)(F + B - W) idle per rank), zb-h2 for m >= 2p - 1, zb-v's list (the
// shortest of three greedy orders) for p <= 4, m >= p. The "near zero" bubble of ZB-H2 and ZB-V in the zero-bubble
// paper is the steady state of steps run back to back with no synchronization between them (its optimizer step is
// validated after the fact), where the skew of one step's start overlaps the previous step's end.
double theoretical_bubble(const pipeline::ScheduleSpec& spec);
// The formula theoretical_bubble uses, for printing: "ideal (p-1)/(m+p-1)", "Chimera's (p-2)/(2m+p-2), F = B",
// "zero-bubble bound (p-1)/(3m+p-1), F = B = W", ...
std::string theoretical_bubble_formula(const pipeline::ScheduleSpec& spec);

}  // namespace mt::plan
