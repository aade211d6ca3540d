// Cross-memory attach (process_vm_readv / process_vm_writev): one copy between this process and another one on the
// same host, done by the kernel, which pins the remote pages. Used by the single-copy collectives (shm_comm.cpp) and
// by the point-to-point engine's single-copy path for large messages (p2p.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::comm::shm {

// Copies `bytes` between `local` in this process and `remote` in process `pid` (write: from local to remote; else
// from remote to local), looping over partial transfers. False if the kernel refuses or fails (EPERM where ptrace
// access is not allowed, ESRCH once the process has ended, EFAULT for an unmapped range); errno says which.
bool cma_copy(int pid, char* local, uint64_t remote, size_t bytes, bool write);

}  // namespace mt::comm::shm
