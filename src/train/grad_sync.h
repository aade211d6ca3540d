// Gradient synchronization (the exchange): what turns this rank's gradient of its share into the update of
// the step. One implementation per method, chosen once when the run starts (make_grad_sync; the parameter
// server's two: make_ps_parts, ps_sync.h); the step loop calls the same few methods whatever the method:
//
//   begin_run -> per step: begin_step(s) -> task forward/backward with hooks() -> step(s): reduce(s) ->
//   global_loss -> grad_norm -> (tail: divergence check, clip) -> update -> outcome to the sink ->
//   annotate(row) -> settle(s) before evaluation and checkpoints -> end_run -> report
//
//   method       store group    reduce(s) after backward                        update
//   exact        dp             buckets in flight during backward (ZeRO 0-3)     store (ZeRO: own shard,
//                               when the step executor calls the hooks; else     all-gather)
//                               (pipeline, ZeRO 0/1) the whole gradient over
//                               dp; tied copies summed over first+last stage
//                               before their buckets are reduced
//   compressed   none           codec exchange over dp (parallel/compress), then store
//                               tied copies summed over first+last stage
//   local SGD    none           tied copies summed; warm-up: all-reduce over     store, then every H steps
//                               dp; then each rank's own mean                    the replicas are averaged
//   ps worker    none           step(s) pushes gradient and loss sum to the      (servers apply it; the
//                               servers; begin_step waits for parameters at      outcome arrives with
//                               most K versions old (ps_sync.h)                  the version)
//   ps server    none           step(s) gathers the workers' pushes for s        its slice, then publishes
//   gossip,      none           own share's mean gradient                        store, then the model mixed
//   decentr.-                                                                    with graph neighbours
//   lowprec                                                                      (gossip_sync.h)
//   1-bit Adam   none           s < K: tied copies summed, all-reduce over dp;  store (OnebitAdam: AdamW
//                               s >= K: nothing (each rank keeps its share)      before K); s >= K: first the
//                                                                                momentum exchange (signs, EF)
//   DGC AdamW    none           s < K: all-reduce over dp; s >= K: nothing       store (DgcAdam: AdamW before
//                                                                                K); s >= K: first top-k of each
//                                                                                rank's preconditioned momentum
//                                                                                (dgc_adam_sync.h)
//
// Every method's dp is the data-parallel group of the rank's (tp, pp) coordinate: it exchanges or averages
// the rank's part of the replica, whatever the split (train_config.cpp's kRefused lists what stays refused).
//
// The parameter store is the run's parallel::DataParallel (flat buffers, buckets, ZeRO allocation, hooks,
// update, whole-tensor gather), built by the run before the exchange over store_groups(): methods that
// exchange gradients themselves give it no group, so it reduces nothing. An exchange uses the store; nothing
// reaches through the exchange for it.
//
// Expert parallelism (model::MoeOptions::local_experts, --ep > 1): a rank's experts are a parameter group of
// their own (nn::Param::expert), which the exact exchange's store reduces (ZeRO 1-3: reduce-scatter and
// shard) over the mesh's edp group, the dp / ep ranks holding replicas of the same experts, while every
// other tensor is reduced over dp. Bytes per step for an MoE layer's experts: ZeRO 0 all-reduce of
// E / ep experts over dp / ep ranks, instead of all E over dp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/compress/exchange.h"
#include "parallel/data/data_parallel.h"
#include "parallel/data/gossip.h"
#include "parallel/mesh/mesh.h"
#include "trace/chrome_trace.h"
#include "train/adaptive_batch.h"
#include "train/step_tail.h"
#include "train/task.h"
#include "train/update_part.h"

namespace mt::train {

enum class SyncMethod { exact, compressed, local_sgd, parameter_server, onebit, sma, gossip, decentralized_lowprec,
                        dgc_adam };

// Everything the synchronizers need from the flags, parsed once.
struct SyncOptions {
  SyncMethod method = SyncMethod::exact;
  parallel::DataParallelOptions engine;
  compress::CompressSpec compress;
  compress::AdaptiveOptions adaptive;
  compress::DgcOptions dgc;
  bool dgc_masking = true;      // dgc_adam: DGC's momentum factor masking
  bool dgc_dense_vectors = false;  // dgc_adam: tensors of < 2 dims sent whole
  bool dgc_global_topk = false;    // dgc_adam: one top-k over the tensors not sent whole
  double dgc_split_clip = 0;       // dgc_adam, --dgc-split-clip: --grad-clip (each share clipped at it / N); 0: off
  uint64_t seed = 0;
  int local_every = 0;          // Local SGD: H
  int64_t local_warmup = 0;     // exact steps first
  bool local_state = false;     // average the optimizer state too
  int64_t freeze_step = 0;      // onebit: exact gradients for steps < K, compressed momentum after
  float beta1 = 0.9f;           // onebit: the momentum's decay (the exchange mixes shares into it)
  AdaptiveBatchOptions grow;    // exact: --adaptive-batch
  int learners = 0;             // sma: L learners per rank
  double sma_alpha = -1, sma_momentum = 0;
  int batch_windows = 0;        // the global batch in windows (the noise scale needs an even split of them)
  parallel::GossipGraph gossip_graph = parallel::GossipGraph::ring;  // gossip, decentralized-lowprec (ring)
  bool gossip_mix_grads = false;   // gossip: mix the gradients with the neighbours before the optimizer step
  bool gossip_mix_params = true;   // gossip: mix the models with the neighbours after it
  int consensus_every = 0;      // decentralized: measure the consensus distance every K steps (0: never)
  int64_t steps = 0;            // the run's --steps (decentralized: the replicas are averaged after the last)
  // exact: the step executor calls the store's hooks, which reduce buckets during backward (the micro-batch
  // loop; a pipeline under ZeRO 2, 3); false: the gradient is reduced whole after the backward (a pipeline
  // under ZeRO 0, 1 passes no hooks).
  bool overlapped = true;
  static SyncOptions from(const TrainConfig& cfg);
};

// What the method's store reduces over: the data-parallel group and the expert group of local experts
// (exact), or nothing (methods that move gradients themselves).
struct StoreGroups {
  comm::Communicator* group = nullptr;
  comm::Communicator* experts = nullptr;
};
StoreGroups store_groups(const SyncOptions& o, const parallel::Mesh& mesh);

// What a step came to: the global batch's mean loss, the gradient norm before clipping, the learning rate.
struct StepOutcome {
  double loss = 0, norm = 0;
  float lr = 0;
  // Method fields of the step's row known only with the outcome (a window's steps: train/sync_window_steps.h).
  nlohmann::json fields;
};
// A step whose exchange ran apart from its update (train/split_exchange.h): the global batch's loss sum and the
// pre-clip global norm of the reduced gradient the registry holds.
struct PresummedStep {
  double loss_sum = 0, norm = 0;
};

// Where an exchange hands a step's outcome: at once (synchronous methods) or when it learns it (a
// parameter-server worker, when the step's version arrives).
using OutcomeSink = std::function<void(int64_t s, const StepOutcome& out)>;

// What a method adds to the closing summary (collective where the method's report is): a section and a line.
struct ExchangeReport {
  std::string key;  // empty: nothing
  nlohmann::json section;
  std::string line;
};

class GradSync {
 public:
  virtual ~GradSync() = default;

  // What the task calls around parameter groups and micro-batches.
  virtual StepHooks hooks();
  // The optimizer the run's updates drive, once it exists (before a resume loads any state; its state buffers
  // are declared): a method that keeps copies of that state sizes them here.
  virtual void attach_optimizer(optim::Optimizer& opt) {}
  // Before the first step (first: the step the run starts at, after a resume).
  virtual void begin_run(int64_t first) {}
  // Before step s's forward pass: the parameters it uses are here.
  virtual void begin_step(int64_t s) { engine_.begin_step(); }
  // The update of step s, once this rank's backward work is done (loss_sum: its part of the global batch's
  // loss sum; items: the global batch's item count): reduce, the global mean loss and norm, the tail (checks,
  // clipping, learning rate), the optimizer; the outcome goes to the sink.
  virtual void step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt);
  // The update the step executor asks for: step() for the step's one update; under schedules that update after
  // every micro-batch (pipedream, pipemare) micro_step(). The exact exchange only (other methods are refused).
  // part.presummed non-null: the step's reductions already ran (step_presummed).
  // In a window of steps run back to back (part.outcome_later, train/sync_window_steps.h) window_step() instead,
  // and part.window_end then settles the window's outcomes.
  void update_part(int64_t s, double loss_sum, double items, const UpdatePart& part, const StepTail& tail,
                   optim::Optimizer& opt);
  // The update of step s after a split exchange (train/split_exchange.h; the exact exchange at ZeRO 0): the
  // registry holds the reduced gradient, pre the global loss sum and norm. The tail and the update as step().
  void step_presummed(int64_t s, const PresummedStep& pre, double items, const StepTail& tail, optim::Optimizer& opt);
  // Windows of steps run back to back (the exact exchange only; others throw mt::Error): window_step is step()
  // with nothing that needs another pipeline stage before the update: the tied copies' sum arrives point to
  // point (the last stage sends its copy at tie_ready(s), after its last input half of step s), the update takes
  // the schedule's learning rate (no clipping: the caller ensures --grad-clip 0), and the loss and the norm's
  // parts are kept; settle_window() reduces them step by step as step() would have (the same bits), runs the
  // tail's checks (a non-finite step stops the run there, after the window's later updates) and gives each
  // step's outcome to the sink. Collective over the world at settle_window only.
  virtual void tie_ready(int64_t s);
  virtual void window_step(int64_t s, double loss_sum, double items, const StepTail& tail, optim::Optimizer& opt);
  virtual void settle_window(const StepTail& tail);
  void set_outcome_sink(OutcomeSink sink) { sink_ = std::move(sink); }
  // Before evaluation, a checkpoint or the end after step s: the parameters after step s are here.
  virtual void settle(int64_t s) { engine_.settle_versions(); }  // an update on its own thread ends here
  // After the last step: every message sent is taken.
  virtual void end_run() {}
  // Collective where the method measures something across ranks; steps: the steps this rank ran.
  virtual ExchangeReport report(int64_t start, int64_t steps) { return {}; }
  // After the backward pass of step s: the gradients the update uses are final.
  virtual void reduce(int64_t s) = 0;
  // The global batch's loss sum from this rank's part (collective over the groups that split it).
  virtual double global_loss(double local_sum) const;
  // Global gradient norm, each element of the model counted once (collective).
  double grad_norm();
  // Bytes this rank has sent on the groups gradients are reduced over (dp and the expert group) so far.
  virtual uint64_t bytes_sent() const;
  void scale(float factor) { engine_.scale_grads(factor); }
  virtual void update(optim::Optimizer& opt, float lr, int64_t s) { engine_.update(opt, lr, s); }
  // Method-specific fields of the step's metrics row.
  virtual void annotate(nlohmann::json& row) const {}
  // Before whole parameters are gathered for a file (Local SGD averages its replicas: a sync).
  virtual void before_gather(optim::Optimizer& opt) {}

 protected:
  GradSync(const parallel::Mesh& mesh, parallel::DataParallel& store, nn::ParamRegistry& params,
           trace::ChromeTrace* tracer);
  const parallel::Mesh& mesh_;
  nn::ParamRegistry& params_;
  parallel::DataParallel& engine_;  // the run's parameter store
  trace::ChromeTrace* tracer_;
  OutcomeSink sink_;
  StepOutcome last_;               // the last step() of this rank's outcome
  double micro_loss_ = 0, micro_norm_ = 0;  // sums over the step's per-micro-batch updates so far
  std::vector<bool> not_counted_;  // per tensor: replicated copies that the norm skips
};

// store: the run's parameter store over params, built over store_groups(o, mesh). tracer: never null (may be
// disabled).
std::unique_ptr<GradSync> make_grad_sync(const SyncOptions& o, const parallel::Mesh& mesh,
                                         parallel::DataParallel& store, nn::ParamRegistry& params,
                                         trace::ChromeTrace* tracer);

}  // namespace mt::train
