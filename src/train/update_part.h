// Which update the step executor asks the exchange for (train/step_executor.h calls, train/grad_sync.h answers).
#pragma once

namespace mt::train {

struct PresummedStep;  // train/grad_sync.h

// part: which gradient the registry holds (the whole step's, or one micro-batch's under schedules that update
// after every micro-batch: pipedream, pipemare).
struct UpdatePart {
  int micro_batch = -1;    // -1: the step's one update; i >= 0: the update after micro-batch i alone
  int micro_batches = 1;   // m of the step
  // A window of steps run back to back (train/sync_window_steps.h): the update leaves the step's loss and norm
  // for later (they need every stage) and window_end asks for every such step's outcome now.
  bool outcome_later = false;
  bool window_end = false;
  // Non-null: the step's exchange already ran (train/split_exchange.h): the registry holds the reduced gradient,
  // and this gives the global loss sum and pre-clip norm.
  const PresummedStep* presummed = nullptr;
};

}  // namespace mt::train
