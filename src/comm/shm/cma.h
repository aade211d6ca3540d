// Reading a peer's memory on the same host in one copy: with ordinary loads when the peer's buffer lies in the
// job's shared heap (core/shared_heap.h, mapped at the same address by every rank), else by cross-memory attach
// (process_vm_readv / process_vm_writev), where the kernel pins the remote pages one 4 KB page at a time. Used by
// the single-copy collectives (shm_comm.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::comm::shm {

// Copies `bytes` between `local` in this process and `remote` in process `pid` (write: from local to remote; else
// from remote to local), looping over partial transfers. False if the kernel refuses or fails (EPERM where ptrace
// access is not allowed, ESRCH once the process has ended, EFAULT for an unmapped range); errno says which.
bool cma_copy(int pid, char* local, uint64_t remote, size_t bytes, bool write);

// Reads `bytes` at `remote` in process `pid` into `local`: a memcpy when the whole range is in the shared heap (the
// peer keeps it valid until the caller's next synchronisation, as for cma_copy), else cma_copy. False as cma_copy.
bool read_peer(int pid, char* local, uint64_t remote, size_t bytes);

// What read_peer did in this process since it started (all threads): bytes and calls by each path.
struct PeerReads {
  uint64_t direct_bytes = 0, direct_calls = 0;  // ordinary loads from the shared heap
  uint64_t kernel_bytes = 0, kernel_calls = 0;  // process_vm_readv
};
PeerReads peer_reads();

}  // namespace mt::comm::shm
