// ZeRO stages 0-3 as small strategies over the shared bucket machinery (buckets.h). DataParallel owns one and
// calls it at fixed points of the step; each stage says what it keeps, when it reduces and how it updates.
//
//   stage  params        grads                     optimizer   per step
//   0      full  4Psi    full  4Psi                8Psi        all-reduce each bucket when its last group's
//                                                              gradients are final (overlaps backward)
//   1      full  4Psi    full  4Psi (+ shard)      8Psi/N      reduce-scatter buckets, update own shard,
//                                                              all-gather parameters
//   2      full  4Psi    shard 4Psi/N              8Psi/N      as 1, but a group's full gradients exist only
//                        (+ <= 2 groups in flight)             from its first write to its reduce-scatter
//   3      shard 4Psi/N  shard 4Psi/N              8Psi/N      as 2, and a group's full parameters are
//                        (+ 1-2 gathered groups)               gathered before each use, the next group is
//                                                              prefetched, and they are freed after use
//
// Under --precision bf16 (the mirror) stage 3 gathers in two precisions: the tensors that products alone read
// (nn::Param::read_f32 false: the linear layers' weights, the router's, the experts', the MLP's) arrive only
// as bf16 (the bucket's all-gather moves 2 bytes per element instead of 4) into the group's mirror, from this
// rank's shard rounded once per step after the update; the tensors read as float32 (LayerNorms, biases, wte
// and wpe for the lookup) arrive as float32 in a second, packed all-gather, and their products (the tied
// logits) round them per product. A bucket without a product-only tensor is gathered in float32 alone. While a
// group is gathered a product-only tensor's data is null: only its data16 exists.
//
// Each bucket is reduced and sharded over its own group (buckets.h): dp, or the expert-replica group for
// this rank's experts.
//
// Stages 0 and 1 reduce only after the last micro-batch (gradients accumulate locally first); stages 2 and 3
// reduce-scatter every micro-batch and accumulate their shard. Under a pipeline schedule
// (DataParallel::begin_accumulation) every stage reduces each bucket once per step, after its groups' last
// backward; stage 3 still gathers a group around every forward and backward of every micro-batch: per step
// 2 m all-gathers of the stage's parameters and one reduce-scatter of its gradient.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "optim/optimizer.h"
#include "parallel/data/buckets.h"

namespace mt::offload {
class ShardFile;
}

namespace mt::parallel {

class ZeroStage {
 public:
  explicit ZeroStage(BucketSet& b) : b_(b) {}
  virtual ~ZeroStage() = default;

  // Finalizes the registry with what this stage keeps, cuts the buckets, sizes the shard buffers.
  virtual void allocate() = 0;
  const std::vector<optim::Segment>& segments() const { return segments_; }
  // ZeRO 1: the all-gather that ends an update made in another copy of the parameters (params, the registry's
  // layout; train/overlapped_update.h).
  void gather_updated(float* params) { all_gather_params(params); }
  virtual size_t state_size() const { return shard_total_; }
  // fill(p) writes p's full tensor into p.data; this rank keeps its part.
  virtual void initialize(const std::function<void(nn::Param&)>& fill);

  // The bf16 mirror of the weights products read (DataParallelOptions::bf16_mirror, nn::ParamRegistry): stages
  // 0-2 keep it beside the full parameters (enable_mirror; refresh_mirror rounds them into it); stage 3 keeps
  // this rank's shard rounded to bf16 (refresh_mirror) and gathers a group's mirror from it with the group.
  virtual void enable_mirror() { b_.params.enable_mirror(); }
  virtual void refresh_mirror() { b_.params.refresh_mirror(); }

  virtual void begin_step() { b_.params.begin_grads(); }  // first writes overwrite: no zeroing pass
  virtual void begin_micro_batch() {}
  // Hooks around group g (bucket b), before DataParallel's own bookkeeping.
  virtual void before_forward(int g) {}
  virtual void after_forward(int g) {}
  virtual void before_backward(int g) {}
  virtual void after_backward(int g) {}
  // Every group of bucket b finished this micro-batch's backward.
  virtual void bucket_ready(Bucket& b) = 0;
  // Without hooks (pipeline): reduce the whole gradient now (stages 0 and 1).
  virtual void reduce_all();

  // The reduced gradient this rank owns, as (pointer, count) pieces; where segments' grad offsets point.
  virtual void for_each_owned_grad(const std::function<void(float*, size_t)>& fn) = 0;
  virtual const float* grad_base() { return b_.params.grad(); }
  // fn(i, g) for every segment i with g its reduced gradient (segments()[i].count floats, at the same address
  // modulo 64 bytes as grad_base() + grad, so that vectorized sums split it alike), in an order of the stage's.
  virtual void visit_grad_segments(const std::function<void(size_t, const float*)>& fn);
  // Where segments' param offsets point (the stage's update passes the same base): the parameters this rank
  // keeps resident, resident_count() floats.
  virtual const float* param_base() { return b_.params.data(); }
  float* resident() { return const_cast<float*>(param_base()); }
  virtual size_t resident_count() const { return b_.params.size(); }
  // Waits for parameter gathers in flight and frees gathered copies (stage 3), so that the resident
  // parameters can be rewritten (an update, a version swap) without a copy holding the old values.
  virtual void release_params() {}
  // An update still running on the stage's own thread (ZeRO 3's --overlap-update) finishes (its error thrown
  // here): before anything reads the parameters or the optimizer state between steps; stop() ends it without
  // throwing (a run's end or an error unwinding), before the optimizer it uses goes.
  virtual void settle() {}
  virtual void stop() noexcept {}
  // The overlapped update's counts (deferred < 0: none): updates run on the thread, how many of them a next
  // forward released (MESHTRAIN_OVERLAP_HOLD=1 only), seconds the main thread waited for them, shards taken
  // from the update's copy.
  struct OverlapCounts {
    int64_t deferred = -1, overlapped = 0;
    double waited_s = 0;
    int64_t fresh_taken = 0;  // bucket shards a forward took from the update's copy in memory, not the file
    // Of waited_s: the waits of groups' gathers for their own shard (the rest waited for the whole update), and
    // of those the first wait after each update's start (the next forward's first group).
    double waited_group_s = 0, waited_first_s = 0;
    int64_t kept_copied = 0;  // shard elements the updates' first tiles took from the backward's gathers, not the file
  };
  virtual OverlapCounts overlap_counts() const { return {}; }
  virtual bool sharded() const { return true; }  // owned gradients are a shard: norms add over dp
  virtual void update(optim::Optimizer& opt, float lr, int64_t step) = 0;

  // Consolidation (collective over dp where the stage shards; every rank gets the full flat buffer).
  void full_params(std::vector<float>& out) { full_params_of(param_base(), out); }
  void load_full_params(const float* full) { load_full_params_into(full, resident()); }
  // The same for a buffer laid out as the resident parameters (another version of them).
  virtual void full_params_of(const float* resident, std::vector<float>& out);
  virtual void load_full_params_into(const float* full, float* resident);
  virtual void full_state(const float* shard_state, std::vector<float>& out);
  virtual void load_full_state(const float* full, float* shard_state);

  virtual size_t param_bytes() const {
    return b_.params.size() * (sizeof(float) + (b_.params.mirrored() ? sizeof(uint16_t) : 0));
  }
  virtual size_t grad_bytes() const { return b_.params.size() * sizeof(float); }
  // --offload params / grads: the bytes in files instead of memory, and the files (zero_stage.cpp: ZeRO 3's
  // shards, ZeRO 2's gradient shard, and at stages 0-2 the full parameters and at 0-1 the full gradient).
  virtual size_t offloaded_param_bytes() const { return 0; }
  virtual size_t offloaded_grad_bytes() const { return 0; }
  virtual std::vector<offload::ShardFile*> shard_files() { return {}; }
  // The buffers the offloaded shards' reads and writes take besides the files' staging and the pooled buckets
  // (stage 3: the update's tile buffers, the gradient norm's read-ahead), for an optimizer tile of tile_bytes.
  virtual size_t offload_buffer_bytes(size_t /*tile_bytes*/) const { return 0; }

 protected:
  void gather_shards(const float* shard, float* full);  // all-gather of each bucket's shards (copy alone)
  void take_bucket_shards(const float* full, float* shard);  // this rank's slice of each bucket, packed
  void all_gather_params(float* base = nullptr);          // stages 1, 2: after the update (base: the registry's)
  BucketSet& b_;
  std::vector<optim::Segment> segments_;
  size_t shard_total_ = 0;
};

std::unique_ptr<ZeroStage> make_zero_stage(int stage, BucketSet& buckets);

}  // namespace mt::parallel
