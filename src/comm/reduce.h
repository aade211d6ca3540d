// Element-wise reduction kernels shared by every backend: combine n source buffers into one destination.
// Sources are combined in index order 0..n-1 in float32, so every rank that reduces the same elements from
// the same sources gets bit-identical results. Blocks of kBlock elements keep the float32 accumulator in
// L1; the loops are plain and left to the compiler to vectorize.
#pragma once

#include <cstddef>

#include "comm/types.h"

namespace mt::comm {

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... srcs[nsrc-1][i], for i < count; for avg the sum is divided
// by `divisor` (the group size). Any src may alias dst exactly (in place); partial overlap is not allowed.
// `stream`: dst is shared memory another core reads next, written with streaming stores (see comm/copy.h);
// the caller publishes it through a signal, which fences them.
void reduce_into(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                 int divisor, bool stream = false);

// The plain reference used by tests: one element at a time, same order, same rounding.
void reduce_reference(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                      int divisor);

}  // namespace mt::comm
