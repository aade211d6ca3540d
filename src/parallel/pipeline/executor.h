// Runs one rank's pipeline action list (schedule.h) for one optimizer step: posts receives of activations
// and gradients where the list says (one computation ahead, so they arrive while the current one computes),
// waits for them before the compute that reads them, runs its chunks' forward and backward, and sends
// (non-blocking) what the next and previous stages need; at the optimizer_step action it completes the sends
// issued so far and calls the run's update. Which stage a chunk computes, and whether a neighbouring stage is
// on this rank (handed over in memory) or another (a message), is the schedule's placement. The
// communication rule of schedule.h makes this deadlock-free; every wait has the communicator's deadline.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stats.h"
#include "trace/chrome_trace.h"

namespace mt::pipeline {

// What the executor needs from the model: per (chunk, micro-batch), forward from an input activation
// (null on global stage 0, which reads its tokens) to an output activation (returned; null on the last
// global stage), and backward from the output's gradient (null on the last stage) to the input's gradient
// (returned; null on stage 0). A forward's returned pointer must stay valid until the backward of the same
// (chunk, micro-batch) (the executor copies it into the message it sends; with one rank it hands it to the
// next chunk's forward); backward's until the next call. Messages carry the tensor plus the sender's clock.
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  virtual size_t activation_count() const = 0;  // floats in one micro-batch's activation
  virtual const float* forward(int chunk, int micro_batch, const float* input) = 0;
  // Optional: the forward with its output written into `out` (room for activation_count() floats), a buffer the
  // executor then sends as it is, without copying the output into a message. Called instead of forward for a stage
  // whose output goes to another rank. The default returns false without computing: the executor then calls forward
  // and copies its output into the message at the send (runners whose output lives in their own storage).
  virtual bool forward_into(int chunk, int micro_batch, const float* input, float* out);
  // Optional, as forward_into for the gradient: backward (input_half: backward_input) with the input's gradient
  // written into `out`, the executor's buffer that is then the gradient message (or, for a previous stage on this
  // rank, its output gradient). Called instead of backward / backward_input on every stage but the first; the
  // default returns false without computing, and the executor copies the runner's gradient as before.
  virtual bool backward_into(int chunk, int micro_batch, const float* output_grad, bool input_half, float* out);
  virtual const float* backward(int chunk, int micro_batch, const float* output_grad) = 0;
  // The split backward (schedule.h): backward_input returns the input's gradient as backward does (null on
  // stage 0), backward_weight then accumulates the parameter gradients. Runners without it throw mt::Error.
  virtual const float* backward_input(int chunk, int micro_batch, const float* output_grad);
  virtual void backward_weight(int chunk, int micro_batch);
};

// What an optimizer_step action does: the run's update of this rank's parameters (empty: nothing).
using OptimizerStep = std::function<void()>;

// Runs schedule[pp.rank()]. pp: the pipeline group (rank j = pipeline position). Messages are tagged by
// (kind, micro-batch, stage). stats (may be null) accumulates this call's timings (its span leaves out the
// optimizer step); trace (may be null or disabled) records every computation (compute track: "F3c1" =
// forward of micro-batch 3, chunk 1; B a backward, I and W the input and weight halves of a split one) and every receive (from post to arrival seen) and send (from issue to
// completion seen) on the p2p track.
void run_actions(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp, StageRunner& runner,
                 PipelineStats* stats = nullptr, trace::ChromeTrace* trace = nullptr, const OptimizerStep& step = {});

// The same, keeping its message buffers between calls (one per training run: steady-state steps allocate
// nothing).
class PipelineExecutor {
 public:
  PipelineExecutor();
  ~PipelineExecutor();
  void run(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp, StageRunner& runner,
           PipelineStats* stats = nullptr, trace::ChromeTrace* trace = nullptr, const OptimizerStep& step = {});

  // The same list run in pieces (a window of steps without a flush, no_flush.h): begin, then run_to as often as
  // needed, each running this rank's actions up to (not including) index end, then finish, which completes the
  // sends and adds the stats (the span is begin to finish, less the optimizer steps). spec, schedule and runner
  // must outlive the pieces. local_updates: the optimizer steps issue no blocking collective (train/
  // split_exchange.h), so the sends of the list stay in flight beside them (those completed are recycled) instead
  // of being waited for first: under a transport whose large sends wait for the receiver (MPI's rendezvous), that
  // wait would need a peer that is itself waiting in its update.
  void begin(const ScheduleSpec& spec, const Schedule& schedule, comm::Communicator& pp, StageRunner& runner,
             trace::ChromeTrace* trace = nullptr, bool local_updates = false);
  void run_to(size_t end, const OptimizerStep& step);
  void finish(PipelineStats* stats = nullptr);
  bool in_window() const { return piece_ != nullptr; }
  size_t position() const;  // the next action's index in the list being run in pieces

 private:
  struct Pieces;
  std::vector<std::vector<float>> pool_;
  std::unique_ptr<Pieces> piece_;
};

}  // namespace mt::pipeline
