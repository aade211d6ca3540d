// An optimizer whose learning rate differs per segment: step() groups the segments by the factor `factor(s,
// step)` gives each and runs the wrapped optimizer once per group with lr * factor (the product in float32).
// PipeMare's learning-rate rescheduling (train/pipemare.h) is one such factor: per pipeline stage, by its delay.
//
// Exactness: the wrapped optimizer must update each element from that element's parameter, gradient, state and
// the step's scalars (AdamW, SGD): then a group's call gives the bits one call with that learning rate would. The
// clipping scale (scale_next_grads) is handed to every group's call. Optimizers with a whole-tensor statistics
// phase (LAMB, Adafactor) are refused where this part is composed (a group's sums would mix rates).
#pragma once

#include <functional>
#include <memory>

#include "optim/optimizer.h"

namespace mt::optim {

class ScaledLrOptimizer final : public Optimizer {
 public:
  using Factor = std::function<double(const Segment& s, int64_t step)>;
  ScaledLrOptimizer(std::unique_ptr<Optimizer> inner, Factor factor);
  void step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
            int64_t step) override;
  StateStore& state() override { return inner_->state(); }
  const StateStore& state() const override { return inner_->state(); }

 private:
  std::unique_ptr<Optimizer> inner_;
  Factor factor_;
  std::vector<Segment> group_;
};

}  // namespace mt::optim
