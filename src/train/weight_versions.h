// The delay-1 rule's weight versions: one part of the step, the same for `--delayed-update` (ZeRO-Offload's
// delayed parameter update) and `--schedule pipedream-2bw` (two weight versions per stage), whatever the
// layout. The rule, in the words: the gradient used at step t is that of step t's global batch
// evaluated at the weights W(t-1) (W(-1) = W(0)), clipped by its own global norm, and applied by the optimizer
// to W(t): W(t+1) = opt(W(t), g_t). The metrics row of step t reports the loss and pre-clip norm of that
// evaluation. The rule does not depend on the layout, so every layout equals the rule at one process to float32
// rounding (tests/parity/test_delay_one.py).
//
// Two buffers of the rank's resident parameters (ZeRO 0-2: the registry's whole flat buffer; ZeRO 3: its
// packed shards): A, the one the model reads and the optimizer updates (the store's; its address is held by
// layers and gathers), and S, the other version. Between steps A holds the master W(t) (what evaluation,
// checkpoints and --save see) and S holds W(t-1):
//
//   between steps        A = W(t)     S = W(t-1)
//   before_forward       swap(A, S):  A = W(t-1)  S = W(t)       forward and backward of step t read W(t-1)
//   before_update        A <- S:      A = W(t)    S = W(t)       the clip and the optimizer see g_t at W(t-1)
//   optimizer            A = W(t+1)   S = W(t)
//
// Cost per step: one swap and one copy of the resident parameters (6 x 4 bytes of memory traffic per resident
// float: the swap reads and writes both buffers, the copy reads one and writes the other); memory: one more
// copy of them (4 bytes per resident float), the second weight version. Nothing is communicated: every rank
// applies the rule to its own part, so the versions of a ZeRO 1/2 replica (whole on each rank, updated in
// shards and all-gathered) stay equal across the data-parallel group because A does.
#pragma once

#include <cstddef>
#include <memory>

#include "parallel/data/param_versions.h"
#include "parallel/pipeline/schedule.h"
#include "tensor/buffer.h"

namespace mt::train {

struct TrainConfig;

class DelayOneVersions : public parallel::ParamVersions {
 public:
  // S starts as a copy of A: W(-1) = W(0). A resume then loads S from the checkpoint.
  void bind(float* resident, size_t n) override;
  void before_forward() override;
  void before_update() override;
  float* other() override { return s_.data(); }
  size_t bytes() const override { return n_ * sizeof(float); }

 private:
  float* a_ = nullptr;
  size_t n_ = 0;
  AlignedBuffer s_;
};

// Whether the run follows the delay-1 rule: --delayed-update, or a schedule whose generator keeps two weight
// versions (pipedream-2bw).
bool delay_one(const TrainConfig& cfg);

// Whether the run's schedule updates each stage after every micro-batch (pipedream, pipemare; pp > 1).
bool micro_updates(const TrainConfig& cfg);

// The part the run's parameter store gets (null: the exact rule, one version): the delay-1 versions, or the
// stash of a schedule that updates after every micro-batch (train/weight_stash.h; schedule: the run's, null
// without a pipeline).
std::unique_ptr<parallel::ParamVersions> make_weight_versions(const TrainConfig& cfg,
                                                              const pipeline::Schedule* schedule = nullptr);

}  // namespace mt::train
