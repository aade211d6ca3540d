// Replica facts (nn::Replicas) of a task's tensors from the layout, set once when the task is built and
// read by the gradient norm, the reductions (grad_sync.h) and the whole-model files (consolidate.h).
//
//   tensor-parallel copies   a tensor with no shard axis under tp > 1 is held whole by every tp rank
//                            (identical gradients): tp rank 0's copy counts in the norm and is saved
//   tied copies              a tensor both the first and the last pipeline stage declare (the tied
//                            embedding): each stage's gradient is a part, summed over the tie group; the
//                            first stage's copy counts and is saved
//   mirrored copies          under a bidirectional placement (chimera: stage s on ranks s and p - 1 - s) every
//                            tensor of a rank is held by its mirror rank too: each copy's gradient is a part
//                            (its pipeline's micro-batches), summed over the pair (the mesh's tie group, which
//                            then pairs j with p - 1 - j); the copy on the rank whose first chunk (the down
//                            pipeline's stage) declares it counts and is saved, the tied wte's on rank 0
#pragma once

#include <set>
#include <string>

#include "nn/params.h"

namespace mt::train {

// tied: the names of the tensors the first and the last stage both declare (found by declaring both, not by
// name: the task's tied_tensors); first_stage: this rank holds the first pipeline stage.
void set_replica_facts(nn::ParamRegistry& params, int tp_rank, int tp_size, const std::set<std::string>& tied,
                       bool first_stage);

// Every tensor summed over the mirror pair (groups tie, summed); counted and saved where counted_here holds its
// name (and tp rank 0 for a tensor every tp rank holds whole).
void set_mirror_facts(nn::ParamRegistry& params, int tp_rank, int tp_size, const std::set<std::string>& counted_here);

// The names two declared registries have in common.
std::set<std::string> common_tensors(const nn::ParamRegistry& a, const nn::ParamRegistry& b);

}  // namespace mt::train
