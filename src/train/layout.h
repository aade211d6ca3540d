// The batch layout of a run, computed once from the flags and the data-parallel degree: the global batch,
// each data-parallel rank's share of it for each step (a list of micro-batch sizes), the micro-batch size and
// count, and the pipeline schedule. Every place that needs m (micro-batches) or a rank's windows reads them
// here; the step loops ask for each step's share, so uneven shares (by measured speed) change no loop.
//
// Legend: B global batch (windows or examples), N data-parallel ranks, b = B / N a rank's share,
// u micro-batch size (--micro-batch-size, default b), m = b / u micro-batches, p stages, V chunks per rank.
//
//   training   rank r takes windows [r b, (r + 1) b), in m micro-batches of u; B % (N u) == 0 is required,
//              so every share and micro-batch is whole. Shares of one step may differ in their sizes but
//              not in their count m (the hooks' collectives run per micro-batch); the loss stays the mean
//              over the global batch whatever the shares.
//   evaluation rank r takes windows [r e, min(B, (r + 1) e)), e = ceil(B / N) (uneven: trailing ranks may get
//              fewer or none), in micro-batches of u (default: the share), the last one possibly short.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::train {

struct TrainConfig;

// Windows [first, first + count()) of the global batch, in micro-batches of sizes[0], sizes[1], ... windows.
struct BatchShare {
  int first = 0;
  std::vector<int> sizes;  // windows per micro-batch, in order
  // Micro-batches of u windows covering [first, first + count), the last one shorter when u does not divide.
  static BatchShare even(int first, int count, int u);
  int count() const;
  int micro_count() const { return (int)sizes.size(); }
  int micro_first(int i) const;
  int micro_len(int i) const { return sizes[(size_t)i]; }
  int micro_size() const;  // the largest micro-batch (1 when there is none)
};

class BatchLayout {
 public:
  // Throws InputError naming the flags when B, N, u, --seq-len x --tp (sequence parallel) or the schedule
  // do not fit together.
  BatchLayout(const TrainConfig& cfg, int dp_ranks);

  int global_batch() const { return B_; }
  int dp_ranks() const { return N_; }
  int per_rank() const { return B_ / N_; }
  int micro_size() const { return u_; }
  int micro_count() const { return per_rank() / u_; }
  BatchShare share(int dp_rank, int64_t step) const;  // training: step's share (even: the same every step)
  BatchShare eval_share(int dp_rank) const;  // evaluation (ceil split)

  bool pipelined() const { return spec_.stages > 1; }
  const pipeline::ScheduleSpec& schedule() const { return spec_; }  // stages 1 without a pipeline

 private:
  int B_, N_, u_;
  bool explicit_u_ = false;  // --micro-batch-size given (else u = the share)
  pipeline::ScheduleSpec spec_;
};

}  // namespace mt::train
