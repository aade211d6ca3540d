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
// B_noise (noise_scale.h, items) and three measured times of the last optimizer step: t_compute (the forward and
// backward passes of one global batch: its k-th data step, from its start to the end of its last backward),
// t_exchange (from there to the optimizer step: waiting for the bucket reductions still in flight, the rest of
// the gradient's reduction, the loss and norm all-reduces; the exchange's part the backward did not hide) and
// t_update (the optimizer step). The exchange runs once per optimizer step (once for all k batches):
//
//   E(B)      = (B_noise + B0) / (B_noise + B)                      statistical efficiency of batch B against B0
//   T(k)      = k B0 / (k t_compute + t_exchange + t_update)        items per second at k batches per update
//   G(k)      = T(k) E(k B0)                                        goodput
//   k        <- 2k when 2k <= max_k and G(2k) > G(k); else k         (one doubling at a time; never shrinks)
//
// The exchange passes B_noise = infinity (E = 1) when the averaged |G|^2 estimate is not positive (the true
// gradient is below what the estimator resolves); a negative B_noise counts as 0. The noise scale is measured
// once per optimizer step (its big batch is the k B0 batch). With c = t_compute, f = t_exchange + t_update,
// G(2k) > G(k) reads (1 + a)(1 - b) > 1 with a = f / (2k c + f) and b = k B0 / (B_noise + 2k B0): the larger the
// exchange and update against the compute, the smaller the B_noise at which a bigger batch pays. The times are
// those of one optimizer step (measured, noisy on a shared host): the part of the exchange that overlaps the
// backward is counted in t_compute, not in t_exchange. Each rank measures its own; a decision takes the largest
// of each time over all ranks (grad_sync.cpp, one all-reduce per decision), so that every rank chooses the same k.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
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
// The times of one optimizer step (seconds): see above.
struct StepTimes {
  double compute = 0, exchange = 0, update = 0;
};
// MESHTRAIN_ADAPTIVE_BATCH_TIMES="t_compute_us,t_exchange_us,t_update_us" (or one triple per rank, separated by
// ';', rank r taking triple r mod their count): the times `rank` reports instead of its measured ones (tests:
// decisions that depend on the noise scale alone); nullopt when unset. The ranks still agree on the largest.
std::optional<StepTimes> pinned_step_times(int rank);
double goodput(double b_noise, double b0, int k, const StepTimes& t);
// The next k from k (the rule above).
int choose_batches(double b_noise, double b0, int k, int max_k, const StepTimes& t);

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
  // After data step s (times in seconds: t_compute of this data step; t_exchange and t_update < 0 when the
  // optimizer did not step; b_noise NaN: no estimate this step, no decision): may change k, only when no
  // batches are pending.
  void observe(int64_t s, double t_compute, double t_exchange, double t_update, double b_noise);
  // Whether observe(s, ..., t_update, b_noise) with t_update >= 0 exactly when `stepped` and a finite or infinite
  // b_noise decides: the same on every rank, so that the ranks can agree on the times first (each rank measures
  // its own; they must all choose the same k).
  bool decides(int64_t s, bool stepped) const;
  int k() const { return k_; }
  void annotate(nlohmann::json& row) const;

 private:
  AdaptiveBatchOptions o_;
  double b0_;
  int k_ = 1, pending_ = 0, k_used_ = 1;
  int64_t updates_ = 0;
  bool updated_ = false;
  StepTimes t_;
  double gain_ = 0, b_used_ = 0;
};

}  // namespace mt::train
