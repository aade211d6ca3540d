// PipelineStats: what the executor measures on one rank, as plain numbers (no communicator), so the planner
// (plan/bubble.h) can read them without depending on comm/.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::pipeline {

// What one rank measured while running its list (wall-clock microseconds), accumulated over calls.
//   span     from the list's start to its end (all sends delivered)
//   forward  summed forward computations; backward likewise; wait: time blocked in wait_recv
// The measured bubble of a step is 1 - sum over ranks of (forward + backward) / (p * max span); the trainer
// gathers these per rank and compares with plan::simulate under the measured backward/forward ratio.
//   chunk_weight  per chunk, the weight halves (backward_weight) of split backward passes: a part of
//            chunk_backward, so the planner can split each stage's measured backward as it ran
//   latency  summed over messages sent while their receiver was already waiting for them: from the send to
//            the receiver running again (transfer plus wake-up), and how many such messages
//   send, post  the rank's own time inside its sends (the copy into the message buffer and the transport's
//            isend) and inside its receive posts (irecv), summed, and how many of each: time the rank computes
//            nothing, which the simulator charges per message (plan::CostModel::send, post)
struct PipelineStats {
  double span_us = 0, forward_us = 0, backward_us = 0, wait_us = 0, latency_us = 0;
  double send_us = 0, post_us = 0;
  int64_t sends = 0, posts = 0;
  int64_t latency_samples = 0;
  int64_t forwards = 0, backwards = 0, lists = 0;
  std::vector<double> chunk_forward_us, chunk_backward_us;  // per chunk of this rank (V entries)
  std::vector<double> chunk_weight_us;                      // per chunk: the W halves (in chunk_backward_us)
  void add(const PipelineStats& o);
};

}  // namespace mt::pipeline
