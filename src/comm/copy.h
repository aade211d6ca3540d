// Bulk copies of the collectives' copy-in and copy-out. From kCopyLoopMinBytes up they run an AVX-512 (or
// AVX2) loop with destination-aligned stores instead of glibc's memcpy: glibc 2.36 copies 2 KB .. L2-size
// messages with `rep movsb`, which on AMD Zen 4 (measured on the EPYC KVM host of this work) drops from
// ~50 GB/s to 1.5-15 GB/s when the source and destination sit at unlucky page offsets relative to each
// other (e.g. malloc'ed buffers at page offset 16 against 64-byte-aligned slots): the shm collectives then
// ran at a flat ~2 GB/s, 1 MB messages 5x slower than 2 MB ones. The loop runs at 35-57 GB/s in cache for
// every offset. Large outputs are written with non-temporal (streaming) stores: the destination is not read
// into the cache first (no read-for-ownership), which cuts DRAM traffic of a copy from 3 passes to 2 when
// the output does not fit in cache anyway. Small outputs stay cached for the caller.
//
// Copies INTO shared memory (collective slots, p2p rings) always stream (copy_in). Those lines were last
// read by the peer, so each sits in the peer core's cache, and an ordinary store must first take the line
// from it (read-for-ownership and invalidation). On the EPYC KVM host of this work that costs ~10x in a
// regime that comes and goes (the vCPUs' placement on the host, apparently: two threads of one process
// show it as much as two processes): writing 1 MB that the other core had read took 425-580 us with
// ordinary or AVX-512 stores or prefetchw, 38-39 us with streaming stores, and 32 KB 17.4 us vs 0.9 us,
// 8 MB 3.0 ms vs 0.34 ms; the peer's copy-out was the same either way. OpenMPI's reductions, which also
// copy into shared fragments, slow down the same way; its single-copy (CMA) all-gather does not.
#pragma once

#include <cstddef>

namespace mt::comm {

// Messages at least this large are copied out with streaming stores. 16 MB, not 8: at 8 MB the two ranks'
// buffers and slots (~26 MB for all_gather) still fit the 32 MB L3 of this work's EPYC host, and cached
// copy-out was faster there (2 ranks, all_gather 8 MB 470-489 us against 680-700 us streamed; all_to_all
// 526-558 against 643-681 us; all_reduce 905-1017 against 1070-1082 us).
constexpr size_t kStreamMinBytes = size_t{16} << 20;
// Copies from this size up use the vector loop (below it glibc's memcpy uses vector moves too).
constexpr size_t kCopyLoopMinBytes = 1024;

// dst[0..n) = src[0..n) (no overlap); `stream` selects non-temporal stores. Call stream_fence() before the
// data is handed to another thread or process.
void copy_bytes(void* dst, const void* src, size_t n, bool stream);
// Copy into memory that another core reads next (slots, rings): streaming stores from kCopyLoopMinBytes.
// The signal that publishes the data (shm::signal_store / signal_bump) fences them.
inline void copy_in(void* shared_dst, const void* src, size_t n) { copy_bytes(shared_dst, src, n, true); }
void stream_fence();

}  // namespace mt::comm
