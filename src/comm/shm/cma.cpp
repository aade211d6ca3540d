#include "comm/shm/cma.h"

#include <sys/uio.h>

namespace mt::comm::shm {

bool cma_copy(int pid, char* local, uint64_t remote, size_t bytes, bool write) {
  size_t done = 0;
  while (done < bytes) {
    iovec l{local + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
    ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

}  // namespace mt::comm::shm
