// The shared heap of a shared-memory job: one MAP_SHARED anonymous mapping that the launcher makes before it
// forks the ranks, so every rank maps all of it at the same address. Each rank allocates only from its own slice;
// a peer reads a buffer there with ordinary loads. The single-copy collectives use that (comm/shm/cma.h,
// read_peer): a peer's send buffer in the heap is read with memcpy, one outside it with process_vm_readv, which
// pins the peer's pages one 4 KB page at a time (most of its cost below a few MB). It is our equivalent of a
// registered or symmetric buffer (NCCL's ncclMemAlloc, PyTorch's symmetric memory, xpmem for MPI): memory the
// job allocates for communication there, the rest stays private.
//
// Pages are taken on first touch (MAP_NORESERVE: the slices are address space, not memory); a released block of
// 64 KB or more gives its pages back (MADV_REMOVE), smaller ones stay resident for reuse. Outside a
// shared-memory job (one process, MPI ranks, the supervisor) there is no heap: allocate() returns nullptr and
// callers fall back to private memory. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::shared_heap {

// In the launcher, before it forks: maps `ranks` slices of `slice_bytes` each (rounded up to 2 MB). False (and no
// heap) when the mapping fails. Replaces a heap made earlier in this process only after destroy().
bool create(int ranks, size_t slice_bytes);
// In the launcher, after its ranks have ended: unmaps the heap (its pages are freed with the last mapping).
void destroy();
// In a rank, right after the fork: this process allocates from slice `rank` from now on.
void enter_rank(int rank);

// `bytes` (rounded up to 4 KB) from this rank's slice, 4 KB aligned, contents undefined; nullptr when there is
// no heap, this process is not a rank of it, or the slice is full.
void* allocate(size_t bytes);
// Gives back a block from allocate(); false (and nothing done) when `p` is not in the heap.
bool release(void* p);
// True when [p, p + bytes) lies inside one rank's slice (any rank's).
bool contains(const void* p, size_t bytes);

// The bytes of peers' slices that this process has mapped by reading them (Rss of those mappings in
// /proc/self/smaps, now): the kernel counts them in this process's RSS too, though the peers own them.
size_t peer_resident_bytes();

struct Stats {
  size_t live_bytes = 0;  // allocated by this process and not released (rounded to 4 KB)
  size_t peak_bytes = 0;  // the most live_bytes ever held
  size_t blocks = 0;      // live blocks
};
Stats stats();

}  // namespace mt::shared_heap
