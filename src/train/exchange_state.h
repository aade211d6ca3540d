// The per-rank state of a gradient exchange that checkpoints keep: the buffers a method carries from step to
// step on each rank (error-feedback residuals, DGC's velocity, PowerSGD's warm-start Q, 1-bit Adam's worker
// and server errors). Not whole tensors of the model: each rank's own, so they resume only under the same
// layout (world size, and each rank's buffers of the same sizes); elsewhere a resumed run starts them at zero
// and says so (train/observers.cpp, Checkpointer).
//
// File: the lead gathers every rank's buffers, concatenated in state_buffers() order, into one tensor
// "exchange.rank<R>" [n_R] per rank R with n_R > 0 in the checkpoint's optimizer.safetensors; state.json's
// "exchange_state" holds {"method", "ranks", "sizes"} (sizes: n_R per rank) to check a resume against.
#pragma once

#include <string>
#include <vector>

namespace mt::train {

class ExchangeState {
 public:
  virtual ~ExchangeState() = default;
  // This rank's buffers, in a fixed order; their sizes are fixed by the layout and the flags once the run
  // is built (empty buffers are kept as such).
  virtual std::vector<std::vector<float>*> state_buffers() = 0;
  // What the state belongs to (the method and its settings), compared on resume.
  virtual std::string state_method() const = 0;
  // A resume copied the checkpoint's buffers into state_buffers() (not called when it could not).
  virtual void state_loaded() {}
  // What a resume that could not load the state does instead (the lead's warning says it).
  virtual std::string state_fallback() const {
    return "the exchange's per-rank state (error feedback, momentum) starts at zero";
  }
};

}  // namespace mt::train
