// The global batch of a step is defined by the data alone (DESIGN.md): step s uses windows j = 0..B-1 of T
// tokens, window j starting at token o = (s*B + j)*T, inputs tokens[o, o+T), targets tokens[o+1, o+T+1),
// every index taken modulo the shard length (the data wraps). A rank or micro-batch asks for its own slice
// of windows [j0, j0 + nb) and gets exactly the rows the single-process run would give it.
#pragma once

#include <cstdint>

#include "data/token_shard.h"

namespace mt::data {

// inputs[nb, T], targets[nb, T] for windows [j0, j0+nb) of the global batch (B windows) of step s.
void gpt_batch(const TokenShard& shard, int64_t step, int B, int T, int j0, int nb, int32_t* inputs,
               int32_t* targets);

// Token offset where step s begins (for checkpoints: the data position).
int64_t gpt_batch_offset(const TokenShard& shard, int64_t step, int B, int T);

}  // namespace mt::data
