// The exact exchange of one step split in two, for PipeDream-2BW without a flush (train/no_flush_steps.h): the
// reductions of step t start on each rank right after its last backward of step t, without blocking, and are
// finished at U(t), the rank's optimizer step of t (one step later in the window). With the exchange blocking
// inside U(t), every update waited until every rank had reached its U(t), about (p - 1) F per step
// (plan/window_sim.h, all_reached); split, U(t) only waits for what the other ranks started after their last
// backward of step t (norm_started), which has usually finished by then.
//
// The same reductions as the blocking exchange (train/grad_sync.cpp, ExactSync at ZeRO 0 with the pipeline's
// executor calling no hooks), in the same order and on the same data, so the outcome is the same bits:
//   1. the copies of tied tensors summed over the tie group      (sum_tied: one all-reduce per run of tensors)
//   2. the whole gradient all-reduced over dp                      (Stage0::reduce_all)
//   3. the loss sum over pp, then over dp (as float, as sum_across)          (GradSync::global_loss)
//   4. the pre-clip norm: each segment's norm, squares summed in segment order, less the copies not counted,
//      summed over the replica group (as float) and the square root           (GradSync::grad_norm)
// They run on a copy of the rank's gradient of step t (the registry goes on accumulating step t+1), as chained
// non-blocking collectives advanced by poll() between the rank's computations; finish() completes them.
//
// Issue order: every group's collectives must be issued in the same order on all its ranks. Each step's chain
// issues in a fixed order (tie, pp loss; dp gradient; dp loss, replica norm) and a step issues nothing until
// the step before it has issued all of its collectives, so the order on every group is the blocking
// exchange's, whatever the timing. Every wait has the communicator's deadline.
//
// Where it applies (split_exchange_applies): the exact exchange at ZeRO 0 without experts, offloaded gradients
// or parameters, --adaptive-batch or --overlap-update. Elsewhere the no-flush executor runs the blocking
// exchange inside U(t) as before. The gradient noise scale's probe (noise_probe.h) is not measured on this
// path (its sums would be two more blocking collectives per step).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "tensor/buffer.h"

namespace mt::train {

struct TrainConfig;

// Whether cfg's exchange can be split (see above); reason says why not.
bool split_exchange_applies(const TrainConfig& cfg, std::string* reason = nullptr);

class SplitExchange {
 public:
  struct Groups {
    comm::Communicator* tie = nullptr;      // first and last stage (null elsewhere)
    comm::Communicator* dp = nullptr;
    comm::Communicator* pp = nullptr;
    comm::Communicator* replica = nullptr;  // the tp x pp ranks of one replica
  };
  // segments: the store's (ZeRO 0: one per tensor piece, grad offsets into the registry's flat gradient).
  SplitExchange(nn::ParamRegistry& params, const std::vector<optim::Segment>& segments, Groups groups);
  ~SplitExchange();

  // After this rank's last backward of step s: copies the registry's gradient (settled) and starts s's chain.
  // loss_sum: this rank's part of step s's loss sum. Steps start in increasing order.
  void start(int64_t s, double loss_sum);
  // Issues what it can without waiting (between computations).
  void poll();
  struct Outcome {
    double loss_sum = 0;  // the global batch's loss sum
    double norm = 0;      // the global pre-clip norm
  };
  // Completes step s (the oldest started): its reduced gradient is then in `grad` (registry layout).
  Outcome finish(int64_t s, float* grad);
  int in_flight() const { return (int)steps_.size(); }

 private:
  struct Step;
  bool advance(Step& st, bool block);
  void issue_tail(Step& st);

  nn::ParamRegistry& params_;
  std::vector<optim::Segment> segs_;
  Groups g_;
  std::vector<std::pair<size_t, size_t>> tied_runs_;  // (offset, count) in the flat gradient
  std::vector<bool> not_counted_;
  std::list<Step> steps_;
  std::vector<std::unique_ptr<AlignedBuffer>> spare_;  // buffers of finished steps, reused
};

}  // namespace mt::train
