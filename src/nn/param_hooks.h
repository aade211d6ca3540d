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

namespace mt::nn {

class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void before_forward(int group) {}
  virtual void after_forward(int group) {}
  virtual void before_backward(int group) {}
  virtual void after_backward(int group) {}
};

}  // namespace mt::nn
