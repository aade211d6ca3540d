// --adaptive-batch: Pollux-style batch growth (Qiao et al., OSDI 2021: goodput = throughput x statistical
// efficiency) over whole global batches. The run's --batch-size B0 (in items: windows x T tokens for the GPT)
// stays the data step (what --steps, the learning-rate schedule and the data order count); an optimizer step
// takes k of them: each rank accumulates its gradient over the k consecutive data steps as it does over
// micro-batches (the exchange reduces once, after the k-th data step's last micro-batch), the reduced sum is
// divided by k (each data step's gradient is its batch's mean gradient, so the result is the k B0 batch's),
// clipped by its global norm (--grad-clip), and the optimizer steps once, with the learning rate of the k-th
// data step times sqrt(k) (the square-root rule, the one suited to Adam; k = 1 is the plain run, bit for bit).
//
// The choice of k, every `every` optimizer steps after `warmup` data steps, from the measured noise scale
// B_noise (noise_scale.h, items) and the measured times of the last data step (t_batch: forward, backward and
// exchange of one global batch; t_update: the optimizer step):
//
//   E(B)      = (B_noise + B0) / (B_noise + B)                      statistical efficiency of batch B against B0
//   T(k)      = k B0 / (k t_batch + t_update)                       items per second at k batches per update
//   G(k)      = T(k) E(k B0)                                        goodput
//   k        <- 2k when 2k <= max_k and G(2k) > G(k); else k         (one doubling at a time; never shrinks)
//
// The exchange passes B_noise = infinity (E = 1) when the averaged |G|^2 estimate is not positive (the true
// gradient is below what the estimator resolves); a negative B_noise counts as 0. The noise scale is measured
// once per optimizer step (its big batch is the k B0 batch). The rule's times are still those of one data step
// (t_batch, which includes the exchange when that data step ran it) and of the optimizer step alone: the
// exchange now shared by the k batches is not yet credited in T(k), so growth is predicted to pay only where
// B_noise is large against B0 (G(2k) > G(k) reads (1 + a)(1 - b) > 1 with a = t_update / (2k t_batch +
// t_update) and b = k B0 / (B_noise + 2k B0)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace mt::train {

struct AdaptiveBatchOptions {
  bool enabled = false;
  int max_k = 8;        // the largest k (global batches per optimizer step)
  int every = 10;       // optimizer steps between decisions
  int64_t warmup = 10;  // data steps before the first decision (the noise scale's averages settle)
};

double statistical_efficiency(double b_noise, double b0, double b);
double goodput(double b_noise, double b0, int k, double t_batch, double t_update);
// The next k from k (the rule above).
int choose_batches(double b_noise, double b0, int k, int max_k, double t_batch, double t_update);

// The count of data steps per optimizer step and the controller of one run (the gradient accumulates in the
// parameter store, train/grad_sync.cpp).
class AdaptiveBatch {
 public:
  AdaptiveBatch(const AdaptiveBatchOptions& o, double b0_items);
  // The data steps of the current optimizer step before this one (0 .. k - 1).
  int position() const { return pending_; }
  // At data step s's end: true when it completes k of them (the optimizer steps now), and the count starts over.
  bool count_data_step();
  float lr_scale() const;
  // After data step s (times in seconds; t_update < 0 when the optimizer did not step; b_noise NaN: no
  // estimate this step, no decision): may change k, only when no batches are pending.
  void observe(int64_t s, double t_batch, double t_update, double b_noise);
  int k() const { return k_; }
  void annotate(nlohmann::json& row) const;

 private:
  AdaptiveBatchOptions o_;
  double b0_;
  int k_ = 1, pending_ = 0, k_used_ = 1;
  int64_t updates_ = 0;
  bool updated_ = false;
  double t_batch_ = 0, t_update_ = 0, gain_ = 0, b_used_ = 0;
};

}  // namespace mt::train
