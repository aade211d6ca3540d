// Gradient synchronization: what turns this rank's gradient of its share into the update of the step. One
// implementation per method, chosen once when the run starts (make_grad_sync); the step loop calls the same
// few methods whatever the method:
//
//   begin_step -> task forward/backward with hooks() -> reduce(s) -> global_loss -> grad_norm -> (tail:
//   divergence check, clip via scale) -> update -> annotate(row)
//
//   method       engine group   reduce(s) after backward                        update
//   exact        dp             buckets in flight during backward (ZeRO 0-3)     engine (ZeRO: own shard,
//                                                                                all-gather)
//   pipeline     dp             tied copies summed over first+last stage, then   engine
//                               the whole gradient over dp (ZeRO 0/1)
//   compressed   none           codec exchange over dp (parallel/compress)       engine
//   local SGD    none           warm-up: all-reduce; then each rank's own mean   engine, then every H steps
//                                                                                the replicas are averaged
//   ps           none           nothing here: the worker pushes to the servers   (servers apply it)
//
// Every method owns a parallel::DataParallel engine over the registry (buckets, ZeRO allocation, hooks);
// methods that exchange gradients themselves give it no group, so it reduces nothing.
//
// Expert parallelism (model::MoeOptions::local_experts, --ep > 1): a rank's experts are a parameter group of
// their own (nn::Param::expert), which the exact and pipeline engines reduce (ZeRO 1-3: reduce-scatter and
// shard) over the mesh's edp group, the dp / ep ranks holding replicas of the same experts, while every
// other tensor is reduced over dp. Bytes per step for an MoE layer's experts: ZeRO 0 all-reduce of
// E / ep experts over dp / ep ranks, instead of all E over dp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/compress/exchange.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "trace/chrome_trace.h"
#include "train/task.h"

namespace mt::train {

enum class SyncMethod { exact, pipeline, compressed, local_sgd, parameter_server };

// Everything the synchronizers need from the flags, parsed once.
struct SyncOptions {
  SyncMethod method = SyncMethod::exact;
  parallel::DataParallelOptions engine;
  compress::CompressSpec compress;
  compress::AdaptiveOptions adaptive;
  uint64_t seed = 0;
  int local_every = 0;          // Local SGD: H
  int64_t local_warmup = 0;     // exact steps first
  bool local_state = false;     // average the optimizer state too
  static SyncOptions from(const TrainConfig& cfg);
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  parallel::DataParallel& engine() { return engine_; }

  // What the task calls around parameter groups and micro-batches.
  virtual StepHooks hooks();
  void begin_step() { engine_.begin_step(); }
  // After the backward pass of step s: the gradients the update uses are final.
  virtual void reduce(int64_t s) = 0;
  // The global batch's loss sum from this rank's part (collective over the groups that split it).
  virtual double global_loss(double local_sum) const;
  // Global gradient norm, each element of the model counted once (collective).
  double grad_norm();
  // Bytes this rank has sent on the groups gradients are reduced over (dp and the expert group) so far.
  uint64_t bytes_sent() const;
  void scale(float factor) { engine_.scale_grads(factor); }
  virtual void update(optim::Optimizer& opt, float lr, int64_t s) { engine_.update(opt, lr, s); }
  // Method-specific fields of the step's metrics row.
  virtual void annotate(nlohmann::json& row) const {}
  // Before whole parameters are gathered for a file (Local SGD averages its replicas: a sync).
  virtual void before_gather(optim::Optimizer& opt) {}

 protected:
  // engine_group: what the engine reduces over (null: nothing); expert_group: where it reduces expert
  // tensors (the mesh's edp group, for the methods that reduce experts).
  GradSync(const parallel::Mesh& mesh, nn::ParamRegistry& params, comm::Communicator* engine_group,
           const parallel::DataParallelOptions& o, trace::ChromeTrace* tracer,
           comm::Communicator* expert_group = nullptr);
  const parallel::Mesh& mesh_;
  nn::ParamRegistry& params_;
  parallel::DataParallel engine_;
  trace::ChromeTrace* tracer_;
  std::vector<bool> not_counted_;  // per tensor: replicated copies that the norm skips
};

// tracer: never null (may be disabled). Finalizes params (through the engine).
std::unique_ptr<GradSync> make_grad_sync(const SyncOptions& o, const parallel::Mesh& mesh, nn::ParamRegistry& params,
                                         trace::ChromeTrace* tracer);

}  // namespace mt::train
