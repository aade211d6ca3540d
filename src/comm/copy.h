// Bulk copies for the copy-out side of collectives. Large outputs are written with non-temporal (streaming)
// stores: the destination is not read into the cache first (no read-for-ownership), which cuts DRAM
// traffic of a copy from 3 passes to 2 when the output does not fit in cache anyway. Small outputs use
// memcpy and stay cached for the caller.
#pragma once

#include <cstddef>

namespace mt::comm {

// Messages at least this large are copied out with streaming stores.
constexpr size_t kStreamMinBytes = size_t{8} << 20;

// dst[0..n) = src[0..n); `stream` selects non-temporal stores. Call stream_fence() before the data is
// handed to another thread or process.
void copy_bytes(void* dst, const void* src, size_t n, bool stream);
void stream_fence();

}  // namespace mt::comm
