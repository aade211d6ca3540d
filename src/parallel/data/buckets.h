// The bucket machinery every ZeRO stage shares (parallel/data/zero_stage.h): buckets over the flat buffer,
// each rank's shard of each bucket, pooled transient buffers, and the queue of reductions in flight.
//
// Legend: Psi parameters (flat buffer), N = dp ranks, r = this rank, G parameter groups (layers).
// Buckets are runs of consecutive groups in backward (readiness) order, each a contiguous range of the flat
// buffer of about --bucket-mb (or one group each, to bound transient memory); rank r owns the same slice
// comm::shard_of(count, N, r) of every bucket, packed in bucket order (zero_shards.h).
//
// Expert tensors (nn::Param::expert: this rank's experts, held by the dp / ep ranks of its expert-replica
// group) form buckets of their own, reduced and sharded over that group (N' = dp / ep ranks, rank r'), so a
// group with experts is two pieces: its other tensors, then its experts, each in its own bucket.
//
// Reductions are issued in bucket-readiness order, the same on every rank (the hooks fire in the same order),
// complete in issue order, and run their completion (bf16 widening, shard accumulation, buffer release)
// when waited for.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "parallel/data/zero_shards.h"
#include "tensor/buffer.h"
#include "trace/chrome_trace.h"

namespace mt::parallel {

struct DataParallelOptions {
  int zero = 0;
  double bucket_mb = 8;                        // target bucket size (stages 2, 3: one group per bucket)
  comm::DType grad_dtype = comm::DType::f32;   // bf16 halves the bytes moved and changes the math
  // --precision bf16: keep the bf16 mirror of the weights products read (nn::ParamRegistry::enable_mirror),
  // made after every change of the parameters; changes no value (the products round the same way).
  bool bf16_mirror = false;
  // --offload params / grads: the parameters (ZeRO 3: this rank's shard; 0-2: all of them) and the reduced
  // gradient (ZeRO 2, 3: the shard; 0, 1: the full gradient) in files under offload_dir (offload/shard_file.h);
  // every wait for their I/O has offload_timeout_s as its deadline.
  bool offload_params = false, offload_grads = false;
  std::string offload_dir;
  double offload_timeout_s = 600;
  bool offload_events = false;  // keep the files' I/O events for the trace
  size_t offload_io_block = size_t(1) << 20;  // bytes per I/O of those files (offload/block_io.h)
  // --overlap-update without --delayed-update (ZeRO 3 with --offload params): the exact update runs on a thread
  // of the stage's own while the next step's forward runs (zero_stage.cpp, Stage3).
  bool overlap_update = false;
};

struct Bucket {
  int index = 0;                  // in BucketSet::buckets
  int g_lo = 0, g_hi = 0;         // first and last group in flat order (for names)
  int groups = 0;                 // non-empty groups (pieces of groups) in the bucket
  bool expert = false;            // expert tensors: reduced over the expert-replica group
  comm::Communicator* comm = nullptr;  // the group it is reduced and sharded over (null: this rank alone)
  int n = 1, r = 0;               // that group's size and this rank's place in it
  bool alone() const { return n == 1; }
  size_t begin = 0, count = 0;    // flat range
  size_t so = 0, sc = 0;          // this rank's shard within the bucket: [begin + so, begin + so + sc)
  size_t pos = 0;                 // where that shard starts in the packed shard buffers
  int pending = 0;                // groups whose backward has not finished in this micro-batch
  AlignedBuffer grad;             // stages 2, 3: full gradients while in flight
  AlignedBuffer data;             // stage 3: gathered parameters while in use
  bool gathered = false;
  comm::Request gather;           // stage 3: prefetch in flight
};

class BucketSet {
 public:
  // experts: the expert-replica group of the registry's expert tensors (null: one rank holds them).
  BucketSet(nn::ParamRegistry& params, comm::Communicator* dp, const DataParallelOptions& opt,
            comm::Communicator* experts = nullptr);
  ~BucketSet();  // waits for whatever is still in flight
  // Waits (ignoring errors) for every reduction and gather still in flight; their buffers may then be freed.
  void quiesce();
  BucketSet(const BucketSet&) = delete;
  BucketSet& operator=(const BucketSet&) = delete;

  // After the registry is finalized: cut the buckets (one group each, or about bucket_mb) and this rank's
  // shards; returns the packed shard size.
  size_t build(bool one_group_each);
  std::vector<FlatRange> ranges() const;
  // Optimizer segments over this rank's shards, one per (parameter, bucket) piece in flat order; the state
  // side is the packed shard, the parameter and gradient sides the flat buffer or the packed shard.
  std::vector<optim::Segment> shard_segments(bool params_packed, bool grads_packed) const;

  bool alone() const { return !dp || n == 1; }  // no communication over dp
  void bind_data(Bucket& b, float* base);
  void bind_grad(Bucket& b, float* base);
  // From the pool when one of that size is free; contents undefined. In the job's shared heap when there is one
  // (AlignedBuffer::shared): these buffers are the send buffers of the gathers (ZeRO 3's packed and offloaded
  // shards, the offloaded parameters' in-place all-gather), which peers then read with ordinary loads.
  AlignedBuffer acquire(size_t count);
  void give_back(AlignedBuffer& buf);

  // Starts reducing bucket b's gradients send[b.count] over b.comm, in the options' dtype: all-reduce into recv
  // (scatter false) or reduce-scatter of this rank's shard into recv (scatter true; recv null: into a
  // temporary of b.sc floats). then(recv or the temporary) runs once it completed.
  void reduce(Bucket& b, const float* send, float* recv, bool scatter, std::function<void(const float*)> then);
  void complete_oldest();
  void finish();                    // completes everything in flight
  size_t in_flight() const { return inflight_.size(); }
  void poll();                      // trace: note completions seen

  std::string group_name(int g) const;

  nn::ParamRegistry& params;
  comm::Communicator* dp;
  DataParallelOptions opt;
  int n = 1, r = 0;
  comm::Communicator* experts;
  int en = 1, er = 0;             // the expert-replica group's size and this rank's place in it
  bool has_experts = false;       // the registry holds expert tensors
  std::vector<Bucket*> buckets;   // in backward order
  std::vector<std::vector<int>> group_buckets;  // group -> every bucket holding a piece of it
  trace::ChromeTrace* trace = nullptr;
  bool last_micro = true;
  size_t pooled_bytes = 0;        // everything acquire() ever allocated (live or in the pool)

 private:
  struct Pending;
  std::vector<Pending*> inflight_;
  std::vector<AlignedBuffer> pool_;  // freed bucket buffers: reused instead of fresh pages every step
};

}  // namespace mt::parallel
