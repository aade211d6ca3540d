// The end of every optimizer step, the same in every loop (synchronous, parameter server, Hogwild): the
// divergence checks, global-norm clipping, and the learning rate of the schedule.
//
//   loss, norm --> every DivergenceCheck (throws DivergedError naming the step) --> clip: scale the
//   gradient by clip / (norm + 1e-6) when norm + 1e-6 > clip --> lr = schedule(step)
//
// A new guard (a loss spike test, say) is a new DivergenceCheck added to the tail, not a new branch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace mt::train {

class DivergenceCheck {
 public:
  virtual ~DivergenceCheck() = default;
  // Throws DivergedError when step s (loss: mean over the global batch; norm: before clipping) diverged.
  virtual void check(int64_t s, double loss, double norm) = 0;
};

// Non-finite loss or gradient norm. The message: "<loss|gradient norm> is <v> at <where(s)>; training
// stopped<advice(s)> (try a lower --lr or --grad-clip)". advice runs first (it may, say, point the latest
// checkpoint back at a good one) and returns what the user should know (". The last good checkpoint is ...").
class NonFiniteCheck : public DivergenceCheck {
 public:
  using Text = std::function<std::string(int64_t)>;
  explicit NonFiniteCheck(Text where = nullptr, Text advice = nullptr)
      : where_(std::move(where)), advice_(std::move(advice)) {}
  void check(int64_t s, double loss, double norm) override;

 private:
  Text where_, advice_;
};

// A finite loss that blew up (train/divergence_guard.h): `window` steps in a row above `factor` x its running
// median. Steps are named 1-based as in the progress line; advice(s) as for NonFiniteCheck, with s the first
// high step (0-based): checkpoints from before it hold good weights.
class SpikeCheck : public DivergenceCheck {
 public:
  using Text = std::function<std::string(int64_t)>;
  SpikeCheck(double factor, int window, Text advice = nullptr);
  ~SpikeCheck() override;
  void check(int64_t s, double loss, double norm) override;

 private:
  std::unique_ptr<class DivergenceGuard> guard_;
  Text advice_;
};

class StepTail {
 public:
  StepTail(double grad_clip, const optim::LrSchedule& sched) : clip_(grad_clip), sched_(sched) {}
  void add_check(std::unique_ptr<DivergenceCheck> c) { checks_.push_back(std::move(c)); }

  void check(int64_t s, double loss, double norm) const;
  // Clipping factor for `norm` (1 when no clipping applies).
  float clip_factor(double norm) const;
  float lr(int64_t s) const { return sched_.at(s); }
  // All three: checks, then scale(factor) when clipping applies; returns the step's learning rate.
  float finish(int64_t s, double loss, double norm, const std::function<void(float)>& scale) const;

 private:
  double clip_;
  optim::LrSchedule sched_;
  std::vector<std::unique_ptr<DivergenceCheck>> checks_;
};

}  // namespace mt::train
