// The parameter server's two exchanges (parallel/async/param_server.h), driven by the one step loop like
// every other method (trainer.cpp run_steps):
//
//   worker  begin_step(s): waits until the parameters are at most K versions old (the staleness bound);
//           step(s): pushes the gradient and this worker's loss sum to the servers, applies nothing; the
//           outcome of step s (loss, norm, lr) arrives with version s + 1, is checked by the tail (a
//           non-finite one stops this worker too) and goes to the sink (the lead writes the row then);
//           settle(s): waits for version s + 1 (evaluation and checkpoints see the parameters after step s).
//   server  its step executor computes nothing; step(s): gathers every worker's push for s, the global norm
//           over the servers, the tail (checks, clipping, learning rate), the optimizer on its slice, and
//           publishes version s + 1 with the outcome. A non-finite loss or norm is published before the tail
//           stops the run, so that the workers stop with it instead of waiting.
//
// Both measure the staleness the run had (report: the summary's "ps" section, collective over the world).
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/async/param_server.h"
#include "train/consolidate.h"
#include "train/grad_sync.h"
#include "train/step_executor.h"

namespace mt::train {

// A parameter-server rank's exchange and where its whole parameters come from (the servers' slices), which
// share this rank's server (null on workers).
struct PsParts {
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<FlatSource> source;
};

// mesh: a parameter-server mesh (workers and servers); params: the full registry (finalized); last_version:
// the newest version a worker takes (the run's last step + 1); tail: the run's, which a worker's outcomes go
// through; tracer: never null (may be disabled).
PsParts make_ps_parts(const parallel::Mesh& mesh, parallel::DataParallel& store, nn::ParamRegistry& params,
                      const parallel::PsLayout& layout, int64_t last_version, const StepTail& tail,
                      trace::ChromeTrace* tracer);

// A server's step executor: no forward or backward (a server holds no share of the batch), only the update.
std::unique_ptr<StepExecutor> make_server_executor();

}  // namespace mt::train
