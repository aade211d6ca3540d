// The closing summary of a run: memory per rank (gathered to every rank), the pipeline bubble of replica 0
// (measured and simulated for the same schedule), and the JSON file the lead writes (--summary).
#pragma once

#include <nlohmann/json.hpp>

#include "offload/state_swapper.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "train/layout.h"
#include "train/task.h"
#include "train/trainer.h"

namespace mt::train {

// Collective over the world: every rank's memory into sum.ranks.
// io: the offload tiers' reads and writes over the run (zeros without --offload).
void gather_memory(const parallel::Mesh& mesh, parallel::DataParallel& engine, optim::Optimizer& opt,
                   TrainTask& task, const offload::IoCounters& io, TrainSummary& sum);
// Collective over the world: every rank's sum.step_reads, with its shared heap's peak, into sum.peer_reads.
void gather_peer_reads(const parallel::Mesh& mesh, TrainSummary& sum);
// This rank's single-copy reads so far (comm::shm::peer_reads), as RankPeerReads (heap_peak_bytes 0); b - a.
RankPeerReads peer_reads_now();
RankPeerReads operator-(const RankPeerReads& b, const RankPeerReads& a);
// Collective over the world (pipeline runs only): the bubble into sum, and its JSON (null when not timed).
nlohmann::json pipeline_report(const parallel::Mesh& mesh, const BatchLayout& layout, TrainTask& task,
                               const pipeline::PipelineStats* stats, TrainSummary& sum);
// The lead writes --summary: throughput, layout, memory per rank, and the given sections ("pipeline", "ps").
void write_summary(const std::string& path, const TrainSummary& sum, const parallel::Mesh& mesh, int zero,
                   const nlohmann::json& sections);

}  // namespace mt::train
