// Hooks a model calls around the use of each parameter group (a layer's parameters, contiguous in the
// registry's flat buffers). Data parallelism and ZeRO live behind them: gradient buckets start reducing
// when their groups' gradients are final (after_backward), ZeRO-3 gathers a group's parameters just before
// it is used and frees them after. A model with no hooks (nullptr) runs as a plain single process.
//
// Call order within one forward: before_forward(g) ... after_forward(g) around every use of group g; a group
// used twice (GPT's tied embedding: input lookup and output logits) is bracketed once around both. Backward
// likewise with before_backward/after_backward, and after_backward(g) means g's gradients for this
// micro-batch are complete.
#pragma once

#include "nn/params.h"

namespace mt::nn {

class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void before_forward(int group) {}
  virtual void after_forward(int group) {}
  virtual void before_backward(int group) {}
  virtual void after_backward(int group) {}
};

// What a model's forward and backward call: the run's hooks (or none), plus the registry's gradient
// bookkeeping: when group g's backward ends, the gradients of g that no kernel wrote this step are zeroed
// (ParamRegistry::settle_grads) before the hooks hear that they are final.
class GroupHooks {
 public:
  GroupHooks(ParamRegistry& params, ParamHooks* hooks) : params_(params), hooks_(hooks ? hooks : &none_) {}
  void before_forward(int g) { hooks_->before_forward(g); }
  void after_forward(int g) { hooks_->after_forward(g); }
  void before_backward(int g) { hooks_->before_backward(g); }
  void after_backward(int g) {
    params_.settle_grads(g);
    hooks_->after_backward(g);
  }

 private:
  ParamRegistry& params_;
  ParamHooks none_;
  ParamHooks* hooks_;
};

}  // namespace mt::nn
