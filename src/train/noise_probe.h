// Measures what the gradient noise scale (noise_scale.h) needs during exact data parallelism, between the
// model and the parameter store's hooks, for every layout of the exact exchange but expert parallelism: the
// step's global batch is the big batch; the small batches are the step's M equal parts of it whose gradients
// some rank holds whole before the reduction, and this rank's contribution c to the step's mean-loss gradient
// from each of them (c = gbar / M for a small batch's mean-loss gradient gbar) is what is measured:
//   |g_small|^2 = M^2 (sum over the small batches of |c|^2) / M,  B_small = B / M
//   |g_big|^2   = the step's gradient norm squared (the reduced gradient, before clipping), B_big = B
// Which parts are small batches depends on where a whole one's gradient exists:
//   micro-batch loop (pp = 1), ZeRO 0 and 1: each micro-batch of each rank (M = dp x n). As group g's backward
//     of micro-batch i ends (after_backward, before the store may start reducing g's bucket), c_i is the
//     gradient now minus the gradient before the micro-batch (a copy of the buffer is kept when n > 1).
//   micro-batch loop, ZeRO 2 and 3: the same small batches; the store binds a fresh gradient buffer to each
//     micro-batch (its first writes overwrite) and reduce-scatters it after the micro-batch, so at
//     after_backward the group's gradient is c_i itself.
//   pipeline (pp > 1): a stage's micro-batches interleave and each computes only part of the model (and of the
//     tied embedding's gradient, whose parts are summed over the tie group after the step), so no micro-batch's
//     gradient is whole anywhere; the small batch is a dp rank's whole share of the step (M = dp), c its local
//     gradient before the dp reduction: with the store's hooks (ZeRO 2, 3: each bucket is reduced once, after
//     its groups' m-th backward) a group's gradient is read at its m-th after_backward; without them (ZeRO 0,
//     1: the whole gradient is reduced after the schedule) the exchange calls add_whole() before the reduction.
//     Tensors summed over the tie group are read by add_tensors() after that sum, on the copy that counts.
//   So dp = 1 with 4 micro-batches and dp = 4 with 1 see the same small batches, and dp x pp (any ZeRO) sees the
//   same as dp with one micro-batch per rank (its local batch).
// Tensors every tp (or pp) rank holds count once (nn::Replicas::counted); the sum is taken over dp and the
// replica's other parts (tp x pp): two scalar all-reduces per step, the only communication. Nothing is measured
// with expert parallelism (--ep > 1: a small batch's expert gradients are computed on other ranks), with
// offloaded gradient shards, or when the global batch's windows do not split evenly into the M small batches.
#pragma once

#include <vector>

#include "nn/param_hooks.h"
#include "nn/params.h"

namespace mt::train {

class NoiseProbe : public nn::ParamHooks {
 public:
  enum class Mode {
    delta,      // micro-batch loop, the gradient accumulates in place (ZeRO 0, 1)
    fresh,      // micro-batch loop, each micro-batch's gradient in a fresh buffer (ZeRO 2, 3)
    last,       // pipeline with the store's hooks: each group's gradient after its m-th backward
    whole,      // pipeline without hooks: add_whole() before the reduction
  };
  NoiseProbe(nn::ParamRegistry& params, Mode mode = Mode::delta);
  void set_inner(nn::ParamHooks* inner) { inner_ = inner; }
  Mode mode() const { return mode_; }
  // Before micro-batch i of n of a step (micro-batch loop).
  void begin_micro_batch(int i, int n);
  // Before a pipeline step of m micro-batches (Mode::last, the store's accumulation).
  void begin_accumulation(int m);
  // Mode::whole: this rank's whole local gradient, every counted tensor but the tie-summed ones.
  void add_whole();
  // Pipeline modes: the tie-summed tensors (nn::Replicas::summed) that count, after their sum.
  void add_tensors_summed();
  // sum over this rank's small batches of |c|^2 (counted tensors), and how many small batches the rank has.
  double local_sum() const { return sum_; }
  int small_batches() const { return mode_ == Mode::delta || mode_ == Mode::fresh ? n_ : 1; }

  void before_forward(int g) override { inner_->before_forward(g); }
  void after_forward(int g) override { inner_->after_forward(g); }
  void before_backward(int g) override { inner_->before_backward(g); }
  void after_backward(int g) override;

 private:
  double group_sq(int g) const;  // sum of squares of group g's counted, not tie-summed gradients
  nn::ParamRegistry& params_;
  Mode mode_;
  nn::ParamHooks none_;
  nn::ParamHooks* inner_ = &none_;
  std::vector<std::vector<const nn::Param*>> groups_;  // counted tensors per group, tie-summed ones excepted
  std::vector<const nn::Param*> summed_;               // counted tie-summed tensors
  std::vector<float> prev_;                            // Mode::delta: the gradient before this micro-batch
  std::vector<int> backwards_;                         // Mode::last: backward passes per group this step
  double sum_ = 0;
  int i_ = 0, n_ = 1;
};

}  // namespace mt::train
