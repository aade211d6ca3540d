// Data parallelism and ZeRO stages 0-3 over the data-parallel group, behind the model's parameter hooks.
//
// Legend: Psi parameters (flat buffer), N = dp ranks, r = this rank, G parameter groups (layers).
// Buckets are runs of consecutive groups in backward (readiness) order, each a contiguous range of the flat
// buffer of about --bucket-mb (stages 2 and 3: one group each, to bound the transient memory); ZeRO partitions every bucket evenly (comm::shard_of), so rank r owns the
// same slice of each bucket and its optimizer state is the concatenation of those slices.
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
// Gradients arrive already scaled to the global-batch mean (the model's dscale), so reductions are sums.
// Reductions are issued in the same order on every rank because the hooks fire in the same order.
// Under stages 2 and 3 every micro-batch reduce-scatters and its shard is accumulated; under 0 and 1 only
// the last micro-batch communicates (gradients accumulate locally first).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/data/zero_shards.h"
#include "tensor/buffer.h"
#include "trace/chrome_trace.h"

namespace mt::parallel {

struct DataParallelOptions {
  int zero = 0;
  double bucket_mb = 8;                        // target bucket size (stage 3: one group per bucket)
  comm::DType grad_dtype = comm::DType::f32;   // bf16 halves the bytes moved and changes the math
};

class DataParallel : public nn::ParamHooks {
 public:
  // `params` is declared but not finalized; this finalizes it with the stage's allocation. dp may be null
  // (one rank, no communication).
  DataParallel(nn::ParamRegistry& params, comm::Communicator* dp, const DataParallelOptions& opt);
  ~DataParallel() override;

  // Records compute (per group, forward and backward) and communication (per bucket, from issue to the
  // first moment it is seen finished) events.
  void set_trace(trace::ChromeTrace* t) { trace_ = t; }

  int zero() const { return opt_.zero; }
  int ranks() const { return n_; }
  int rank() const { return r_; }

  // Initializes every parameter: fill(p) writes p's full tensor into p.data; this rank keeps its part.
  void initialize(const std::function<void(nn::Param&)>& fill);

  // Elements of this rank's optimizer state (and of the segments' shard side).
  size_t state_size() const;
  const std::vector<optim::Segment>& segments() const { return segments_; }

  // ---- One optimizer step: begin_step, per micro-batch begin_micro_batch + forward/backward with this as
  // hooks, then finish_backward, grad_norm, clip, update. ----
  void begin_step();
  void begin_micro_batch(int index, int count);
  void finish_backward();
  // Without hooks (pipeline parallelism): reduce the whole gradient over the group now: ZeRO 0 all-reduces
  // it, ZeRO 1 reduce-scatters each bucket (this rank keeps its reduced slices).
  void reduce_all();
  // Global L2 norm of the reduced gradient, each parameter element counted once.
  double grad_norm();
  // Sum of squares of the reduced gradient over the whole data-parallel group, and the part of it that
  // falls on the parameters flagged (by registry index; e.g. those replicated across tensor-parallel peers).
  std::pair<double, double> grad_sq(const std::vector<bool>& flagged);
  void scale_grads(float factor);
  void update(optim::Optimizer& opt, float lr, int64_t step);

  // ---- Consolidation (collective over the dp group; every rank gets the full flat buffer). ----
  void full_params(std::vector<float>& out);
  void full_state(const float* shard_state, std::vector<float>& out);
  void load_full_params(const float* full);
  void load_full_state(const float* full, float* shard_state);
  // The buckets' flat ranges in backward order: what ZeRO shards (parallel/data/zero_shards.h).
  std::vector<FlatRange> bucket_ranges() const;

  // Bytes this rank holds persistently for parameters and gradients (transient bucket buffers excluded).
  size_t param_bytes() const;
  size_t grad_bytes() const;
  // Bytes of the transient buffers (stages 2, 3: gradient buckets in flight, gathered parameters), which
  // are pooled: the most this rank ever held at once.
  size_t transient_bytes() const { return pooled_bytes_; }

  void before_forward(int group) override;
  void after_forward(int group) override;
  void before_backward(int group) override;
  void after_backward(int group) override;

 private:
  struct Bucket;
  struct Pending;
  void build_buckets();
  void bind_data(Bucket& b, float* base);
  void bind_grad(Bucket& b, float* base);
  void start_gather(Bucket& b);
  void ensure_gathered(Bucket& b);
  void release_params(Bucket& b);
  void reduce_bucket(Bucket& b);
  void complete_oldest();
  void poll_inflight();
  AlignedBuffer acquire(size_t count);  // zeroed, from the pool when one of that size is free
  void give_back(AlignedBuffer& buf);
  std::string group_name(int g) const;
  void for_each_owned_grad(const std::function<void(float*, size_t)>& fn);
  comm::Request start_reduce(const float* send, float* recv, size_t count, bool scatter,
                             std::function<void()>* on_done);

  nn::ParamRegistry& params_;
  comm::Communicator* dp_;
  DataParallelOptions opt_;
  int n_ = 1, r_ = 0;
  std::vector<Bucket*> buckets_;   // in backward order
  std::vector<int> bucket_of_;     // group -> bucket index
  std::vector<optim::Segment> segments_;
  size_t shard_total_ = 0;
  AlignedBuffer gshard_, pshard_;  // stages 2-3: gradient shard; stage 3: parameter shard
  std::vector<Pending*> inflight_;
  std::vector<AlignedBuffer> pool_;  // freed bucket buffers: reused instead of fresh pages every step
  size_t pooled_bytes_ = 0;          // everything acquire() ever allocated (live or in the pool)
  trace::ChromeTrace* trace_ = nullptr;
  std::vector<double> group_t0_;
  bool last_micro_ = true;
  int micro_index_ = 0;
};

}  // namespace mt::parallel
