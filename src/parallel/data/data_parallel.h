// Data parallelism and ZeRO stages 0-3 over the data-parallel group, behind the model's parameter hooks.
// This class is the fixed sequence of a step; what each ZeRO stage keeps, reduces and updates is a strategy
// (zero_stage.h, with its memory table) over the shared bucket machinery (buckets.h).
//
// Gradients arrive already scaled to the global-batch mean (the model's dscale), so reductions are sums.
// Reductions are issued in the same order on every rank because the hooks fire in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/data/buckets.h"
#include "parallel/data/param_versions.h"
#include "parallel/data/zero_shards.h"
#include "parallel/data/zero_stage.h"
#include "tensor/buffer.h"
#include "trace/chrome_trace.h"

namespace mt::parallel {

// Whether ZeRO stage `zero` needs the hooks wherever the model runs (a pipeline schedule included): stages 2
// and 3 bind a group's full gradients (and parameters) only around its use; 0 and 1 can instead reduce the
// whole gradient after a backward that called none (reduce_all).
inline bool needs_hooks(int zero) { return zero >= 2; }
// The same for the store's options: --offload params and grads bind a group's parameters and gradient only
// around its use at every stage.
inline bool needs_hooks(const DataParallelOptions& o) {
  return needs_hooks(o.zero) || o.offload_params || o.offload_grads;
}

class DataParallel : public nn::ParamHooks {
 public:
  // `params` is declared but not finalized; this finalizes it with the stage's allocation. dp may be null
  // (one rank, no communication). experts: the group over which the registry's expert tensors
  // (nn::Param::expert) are reduced, their replicas within dp (null: this rank holds the only copy).
  DataParallel(nn::ParamRegistry& params, comm::Communicator* dp, const DataParallelOptions& opt,
               comm::Communicator* experts = nullptr);
  // Waits for whatever is in flight before the stage's shard buffers go.
  ~DataParallel() override { b_.quiesce(); }

  // Records compute (per group, forward and backward) and communication (per bucket, from issue to the
  // first moment it is seen finished) events.
  void set_trace(trace::ChromeTrace* t) { b_.trace = t; }

  int zero() const { return b_.opt.zero; }
  int ranks() const { return b_.n; }
  int rank() const { return b_.r; }
  comm::Communicator* expert_group() const { return b_.experts; }

  // Initializes every parameter: fill(p) writes p's full tensor into p.data; this rank keeps its part.
  void initialize(const std::function<void(nn::Param&)>& fill);

  // The bf16 mirror (DataParallelOptions::bf16_mirror; zero_stage.h says where each stage keeps it):
  // the store remakes it after each of its own changes of the parameters (initialize, update, load_full_params);
  // a method that writes the parameters itself (Local SGD's averaging, a parameter-server worker receiving a
  // version) calls this after it. A no-op without a mirror.
  void refresh_mirror() { stage_->refresh_mirror(); }

  // A part keeping a second version of the resident parameters (param_versions.h), called at the step's
  // begin_step (before the first forward) and update (before the optimizer). Set once, after initialize().
  void set_versions(std::unique_ptr<ParamVersions> v);
  ParamVersions* versions() const { return versions_.get(); }
  // Between steps, before the parameters are read (evaluation, checkpoints): a part that runs the update on
  // a thread of its own finishes it (param_versions.h).
  void settle_versions() {
    stage_->settle();
    if (versions_) versions_->settle();
  }
  // Ends an update running on a thread of the store's (no throw), before the optimizer it uses goes.
  void stop_update() noexcept { stage_->stop(); }
  ZeroStage::OverlapCounts overlap_counts() const { return stage_->overlap_counts(); }
  // Per-micro-batch updates (pipedream, pipemare): the next micro-batch's gradients start fresh, as at a
  // step's begin (ZeRO 0 and 1).
  void restart_grads() { stage_->begin_step(); }

  // Elements of this rank's optimizer state (and of the segments' shard side).
  size_t state_size() const { return stage_->state_size(); }
  const std::vector<optim::Segment>& segments() const { return stage_->segments(); }

  // ---- One optimizer step: begin_step, per micro-batch begin_micro_batch + forward/backward with this as
  // hooks, then finish_backward, grad_norm, clip, update. ----
  void begin_step();
  void begin_micro_batch(int index, int count);
  // Instead of begin_micro_batch, under a pipeline schedule (its micro-batches' forward and backward passes
  // interleave, with no boundary between them): gradients accumulate over all `count` micro-batches of the
  // step, and each bucket is reduced once, when every one of its groups has finished `count` backward passes.
  // Stages 2 and 3 then hold a bucket's full gradient from its first backward to its last in the step.
  void begin_accumulation(int count);
  // Waits for the reductions in flight. Buckets holding a tensor whose copies are summed over the tie group
  // (nn::Replicas::summed) are not reduced by the hooks: they keep their full gradient (the tensors' grad
  // pointers stay valid) until reduce_held(), after the exchange has summed the copies.
  void finish_backward();
  void reduce_held();
  // Without hooks (pipeline parallelism): reduce the whole gradient over the group now: ZeRO 0 all-reduces
  // it, ZeRO 1 reduce-scatters each bucket (this rank keeps its reduced slices).
  void reduce_all();
  // Global L2 norm of the reduced gradient, each parameter element counted once.
  double grad_norm();
  // Sum of squares of the reduced gradient over the whole data-parallel group (each expert, held by dp / ep
  // of its ranks, once), and the part of it that
  // falls on the parameters flagged (by registry index; e.g. those replicated across tensor-parallel peers).
  std::pair<double, double> grad_sq(const std::vector<bool>& flagged);
  void scale_grads(float factor);
  // The optimizer's statistics phase (optimizer.h: its rounds, when it asks for some), then its update.
  void update(optim::Optimizer& opt, float lr, int64_t step);
  // Per-tensor sums (k per registry tensor, sums[t * k + j]) of fn over the pieces of the reduced gradient
  // and the parameters this rank owns, made whole: over the tensor's bucket group (dp, or the expert
  // replicas) when the stage shards them, and over tp for tensors split there (shard axis >= 0). Float32
  // reductions (~1e-7 relative, as grad_sq). Collective over those groups.
  std::vector<double> tensor_sums(int k, const optim::PieceSums& fn);
  // The same with first[t] .. first[t + 1] the sums of tensor t (first: T + 1 offsets, as optim::TensorSums).
  std::vector<double> tensor_sums(const std::vector<size_t>& first, const optim::PieceSums& fn);
  // The tensor-parallel group that splits tensors with a shard axis (null: none); for tensor_sums.
  void set_tensor_group(comm::Communicator* tp) { tp_ = tp; }

  // ---- Consolidation (collective over the dp group; every rank gets the full flat buffer). ----
  void full_params(std::vector<float>& out);
  void full_state(const float* shard_state, std::vector<float>& out);
  void load_full_params(const float* full);
  void load_full_state(const float* full, float* shard_state);
  // The same for the other version kept by versions() (as full_params and load_full_params).
  void full_other_params(std::vector<float>& out);
  void load_full_other_params(const float* full);
  // The buckets' flat ranges in backward order: what ZeRO shards (parallel/data/zero_shards.h).
  std::vector<FlatRange> bucket_ranges() const { return b_.ranges(); }

  // Bytes this rank holds persistently for parameters (every version kept) and gradients (transient bucket
  // buffers excluded).
  size_t param_bytes() const { return stage_->param_bytes() + (versions_ ? versions_->bytes() : 0); }
  size_t grad_bytes() const { return stage_->grad_bytes(); }
  // --offload params / grads: bytes in files instead of memory, and the files themselves.
  size_t offloaded_param_bytes() const { return stage_->offloaded_param_bytes(); }
  size_t offloaded_grad_bytes() const { return stage_->offloaded_grad_bytes(); }
  std::vector<offload::ShardFile*> shard_files() { return stage_->shard_files(); }
  size_t offload_buffer_bytes(size_t tile_bytes) const { return stage_->offload_buffer_bytes(tile_bytes); }
  // Bytes of the transient buffers (stages 2, 3: gradient buckets in flight, gathered parameters), which
  // are pooled: the most this rank ever held at once.
  size_t transient_bytes() const { return b_.pooled_bytes; }
  // The buckets (backward order), read by the memory plan (train/offload.h: zero_transient_bytes).
  const std::vector<Bucket*>& buckets() const { return b_.buckets; }

  void before_forward(int group) override;
  void after_forward(int group) override;
  void before_backward(int group) override;
  void after_backward(int group) override;

 private:
  BucketSet b_;
  std::unique_ptr<ZeroStage> stage_;
  std::unique_ptr<ParamVersions> versions_;
  std::vector<bool> tied_;     // per bucket: holds a tensor summed over the tie group
  std::vector<Bucket*> held_;  // ready buckets waiting for reduce_held()
  comm::Communicator* tp_ = nullptr;
  std::vector<double> group_t0_;  // trace: when each group's forward or backward began
};

}  // namespace mt::parallel
