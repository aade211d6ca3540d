// Training runs: the entry points. A run is composed of parts (run.h: mesh, batch layout, task, gradient
// synchronizer, optimizer, state consolidation, observers, step tail) and driven by a short step loop
// (trainer.cpp, for every method but Hogwild; Hogwild: hogwild_trainer.cpp). The model and data live in a
// TrainTask; TrainConfig::validate is in train_config.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "train/train_config.h"

namespace mt::train {

struct RankMemory {
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0, peak_rss_bytes = 0;
  double transient_bytes = 0;  // ZeRO 2/3 bucket and gathered-parameter buffers
  double activation_peak_bytes = 0;  // measured: the most the activation store held at once
  // Offload (--offload): state bytes in files instead of memory, and the tier's reads and writes over the run.
  double optimizer_offloaded_bytes = 0, io_read_bytes = 0, io_written_bytes = 0;
  // --offload params / grads: this rank's parameter and gradient shards in files instead of memory.
  double param_offloaded_bytes = 0, grad_offloaded_bytes = 0;
};

// A rank's single-copy reads of its peers' buffers (comm/shm/cma.h read_peer) over the step loop, by path: ordinary
// loads from the job's shared heap (direct) or process_vm_readv (kernel); all zero where no collective reads a
// peer's memory (one process, MPI). heap_peak_bytes: the most this rank held in the shared heap at once over the
// whole run (core/shared_heap.h; 0 without a heap).
struct RankPeerReads {
  uint64_t direct_bytes = 0, direct_calls = 0, kernel_bytes = 0, kernel_calls = 0, heap_peak_bytes = 0;
  // Peers' heap pages this rank had mapped at the end of the run (read with loads): in its peak_rss_bytes too.
  uint64_t peer_heap_rss_bytes = 0;
};

struct TrainSummary {
  int64_t steps_run = 0;
  double final_loss = 0;
  double items_per_s = 0;  // mean over the steps run, excluding the first (warm-up)
  double flops_per_step = 0;
  int64_t params = 0;
  std::vector<RankMemory> ranks;  // per rank (filled on every rank)
  RankPeerReads step_reads;                // this rank's over the step loop (run_steps), before it is gathered
  std::vector<RankPeerReads> peer_reads;  // per rank (filled on every rank; empty: not gathered, Hogwild)
  double memory_limit = 0;        // --memory-limit (bytes per rank; 0: none)
  // Pipeline runs (replica 0; -1 otherwise): bubble fraction measured, simulated with the measured stage
  // times for the same schedule, and the ideal (p - 1) / (V m + p - 1).
  double bubble_measured = -1, bubble_simulated = -1, bubble_ideal = -1;
};

// Runs training as configured, on `world` (null: a single process). Throws mt::Error subclasses on bad
// input or divergence; every rank throws the same error for the same cause.
TrainSummary run_training(const TrainConfig& cfg, comm::Communicator* world = nullptr);

// Writes cfg.resolved_config to cfg.resolved_config_path (nothing when the path is empty) on world rank 0 (or
// with no world): once per run, after the flags have passed validation, before the first step.
void write_resolved_config(const TrainConfig& cfg, const comm::Communicator* world);

// --async hogwild: cfg.nproc worker threads of this process on shared parameters (hogwild_trainer.cpp).
TrainSummary run_hogwild(const TrainConfig& cfg);

// `meshtrain train`: runs run_training on cfg.nproc local workers (shm) or under mpirun, or in this
// process; returns the process exit code.
int train_main(const TrainConfig& cfg);

}  // namespace mt::train
