// PipeMare's learning-rate rescheduling (Yang et al., MLSys 2021), for --schedule pipemare
// --pipemare-lr-anneal K (docs/parallelism.md, "PipeMare's corrections"): the update number n (counted over the
// run, one per micro-batch) applies to stage j of p the step size lr(s) * tau_j^-(1 - min(n / K, 1)), tau_j = p - j
// (the versions between the weights stage j's forward read, in steady 1F1B, and the weights the update makes).
// The tied embedding (summed over its tie group, held by stage 0 and stage p - 1) takes stage 0's factor on
// both, so its two copies stay equal.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/optimizer.h"
#include "parallel/data/param_versions.h"
#include "tensor/buffer.h"
#include "train/weight_stash.h"

namespace mt::train {

// tau^-(1 - min(n / K, 1)) with tau = p - j (tied: p).
double pipemare_lr_factor(int p, int j, bool tied, int64_t n, int64_t K);

// opt, its learning rate scaled per segment by pipemare_lr_factor for this rank's stage j of p.
std::unique_ptr<optim::Optimizer> pipemare_lr_schedule(std::unique_ptr<optim::Optimizer> opt, int p, int j,
                                                       int64_t K);

}  // namespace mt::train

namespace mt::train {

// PipeMare's discrepancy correction, for --schedule pipemare --pipemare-correction GAMMA (docs/parallelism.md,
// "PipeMare's corrections"): this rank keeps delta, an exponential moving average of its stage's weight changes,
// delta(0) = 0, delta(n + 1) = GAMMA delta(n) + (1 - GAMMA) (W(n + 1) - W(n)) after every update (float32, no
// bias correction), over the run. The forward of micro-batch i reads the newest version (as pipemare without
// the correction); its backward reads, instead of the newest W(v_b), the prediction W(v_b) - d delta(v_b), d =
// v_b - v_f the versions between the forward's and the backward's (0: the newest itself). The update is applied
// to the newest W(v_b). Memory: delta, the newest's copy while a prediction is resident, and W(n) while the
// update makes W(n + 1): three copies of the rank's parameters beside the resident one. delta is not written to
// checkpoints (a resume is refused).
class PipeMareVersions : public MicroVersions {
 public:
  PipeMareVersions(int m, double gamma);
  void bind(float* resident, size_t n) override;
  void before_forward() override;
  void begin_window(const pipeline::Schedule& window, int n) override;  // the window's micro-batches 0..n-1
  void before_update() override;
  void after_update() override;
  void before_micro_forward(int i) override;
  void before_micro_backward(int i) override;
  float* other() override { return nullptr; }
  size_t bytes() const override { return 3 * n_ * sizeof(float); }
  const float* delta() const { return delta_.data(); }

 private:
  void restore();  // resident back to the newest if a prediction is there
  int m_;
  float gamma_;
  float* a_ = nullptr;
  size_t n_ = 0;
  int newest_ = 0;
  bool predicted_ = false, windowed_ = false;
  std::vector<int> fwd_;
  AlignedBuffer delta_, newest_copy_, before_;
};

}  // namespace mt::train
