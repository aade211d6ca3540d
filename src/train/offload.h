// A run's offload tiers (--offload, --offload-dir) and its memory budget (--memory-limit): the optimizer
// wrapped so its flat state streams from a file under the directory (optim/tiled_optimizer.h over
// offload/state_swapper.h), what the tiers report (bytes offloaded, read and written; the trace's io track),
// and the plan of what stays resident, checked against the limit before the first step.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/shard_file.h"
#include "offload/state_swapper.h"
#include "optim/optimizer.h"
#include "parallel/data/buckets.h"
#include "trace/chrome_trace.h"
#include "train/train_config.h"

namespace mt::train {

class OffloadTiers {
 public:
  // With --offload optimizer: opt wrapped over a StateSwapper of its flat buffers in cfg.offload.dir (rank
  // names the rank in messages); otherwise opt as it is. An optimizer with no flat state stays as it is.
  std::unique_ptr<optim::Optimizer> wrap(const TrainConfig& cfg, int rank, std::unique_ptr<optim::Optimizer> opt,
                                         bool trace);
  // The I/O thread's reads and writes so far, as events on the trace's io track.
  void trace_into(trace::ChromeTrace& t);
  // --offload params / grads: the store's shard files (parallel::DataParallel::shard_files), reported and traced
  // beside the optimizer's tier.
  void add_shards(std::vector<offload::ShardFile*> files) { shards_ = std::move(files); }
  // Waits for every shard file's queued jobs (the last update's read-ahead of the next forward's first groups
  // among them), so that the counters, the trace and the summary count the same bytes in every run.
  void drain();
  // The shard and activation files' staging blocks (offload/block_io.h): what they take once used, and the part
  // already held (resident, so inside the RSS a plan measures).
  size_t staging_bytes() const;
  size_t staging_held() const;
  // Every tier's reads and writes summed (optimizer state, parameters, gradients).
  offload::IoCounters counters() const;
  // This rank's tier for --summary's "offload" section (null without one): tiles, bytes and seconds of the
  // I/O thread's reads and writes, the bandwidth they reached, direct I/O or not.
  nlohmann::json report() const;

 private:
  offload::StateSwapper* state_ = nullptr;  // owned by the optimizer's store
  std::vector<offload::ShardFile*> shards_;  // owned by the parameter store
};

// Bytes per I/O of the shard and activation files (offload/shard_file.h): DeepSpeed's 1 MiB, or --offload-tile
// when smaller (their staging is 8 blocks: a small tile keeps that small too).
size_t offload_io_block(const TrainConfig& cfg);

// What a rank keeps in memory, planned once its parts are built and before the optimizer state, the activations
// and a checkpoint's state are loaded (bytes). `now` is what the process holds then (code, libraries,
// communicator, data, parameters and gradients, which are written at initialization); the optimizer's resident
// part (its state in memory, or the offload tier's tile buffers), the offload engine's I/O buffers not held yet
// and one micro-batch's activations come on top. The I/O buffers: each shard or activation file's staging blocks
// (those already used are resident, so part of now, and counted once), ZeRO 3's update tile buffers and the
// gradient norm's read-ahead for offloaded shards. Not planned: what the model and the libraries allocate in a
// step besides those (backward scratch, GEMM workspaces, pipeline micro-batches in flight, ZeRO 2/3 transient
// buckets, which include an offloaded parameter shard's read buffers), a checkpoint's temporary copies;
// --summary reports the measured peak.
struct MemoryPlan {
  double now = 0;
  double params = 0, grads = 0;  // part of now
  double optimizer = 0;    // resident: the state in memory, or the offload tier's tile buffers
  double offloaded = 0;    // optimizer state in files instead
  double activations = 0;  // one micro-batch's, as the task estimates them
  double io_buffers = 0;   // the offload engine's I/O buffers, all of them
  double io_in_now = 0;    // the part of io_buffers already held (in now)
  double scratch = 0;      // the backward's scratch above the activations (Task::backward_scratch_bytes)
  double products = 0;     // the products' operand copies under bf16 (Task::product_scratch_bytes)
  double transient = 0;    // ZeRO 2/3's pooled bucket buffers (zero_transient_bytes)
  double allowance = 0;    // what no part names (memory_allowance): a stated figure, not a derived one
  double total() const {
    return now + optimizer + (io_buffers - io_in_now) + activations + scratch + products + transient + allowance;
  }
  nlohmann::json json() const;    // each part in bytes, and the total, for --summary's "memory_plan"
  std::string describe() const;  // "the process now 30.1 MiB (parameters ... ) + optimizer state ... = 45.0 MiB"
};

// ZeRO 2/3's transient bucket buffers (parallel/data/buckets.h: acquire() pools them by size, so the pool ends
// up with, per size, the most buffers of that size live at once). Per distinct bucket size c held by k buckets:
// gradients min(k, 1) at dp 1 and min(k, 2) with the bucket reduced over other ranks (one reduce-scatter in
// flight while the next bucket's gradient fills); at ZeRO 3 also the gathered parameters, min(k, 2) (the group in
// use and the next one prefetched; GPT's tied embedding is a size of its own), and with --offload params the
// shard reads from the file, min(k, 2) of this rank's shard + 4 KiB of congruent slack (groups g + 1 and g + 2).
// Counted from the measured pools of the GPT at ZeRO 2/3, dp 1 and 2 (docs/offload.md); not covered: bf16's
// gathered halves and send/receive buffers at ZeRO 3, expert buckets' own sizes beyond the same rule.
size_t zero_transient_bytes(const std::vector<parallel::Bucket*>& buckets, int zero, bool offload_params);

// The allowance for what the plan cannot name in advance (GEMM workspaces, thread stacks, allocator slack and
// arenas, the communicator's transient buffers): 16 MiB, and 16 MiB more when the run has more than one rank.
// Measured: peak RSS minus every named part was 8-11 MiB on one rank and 15-25 MiB at dp 2 (docs/offload.md).
double memory_allowance(int world_size);

// Throws InputError naming the limit, the rank, what the plan needs and what would help, when the plan exceeds
// limit (0: no limit).
void check_memory_plan(const MemoryPlan& plan, uint64_t limit, int rank, bool optimizer_offloaded);

}  // namespace mt::train
