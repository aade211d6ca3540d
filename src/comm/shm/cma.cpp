#include "comm/shm/cma.h"

#include <sys/uio.h>

#include <atomic>

#include "comm/copy.h"
#include "core/shared_heap.h"

namespace mt::comm::shm {
namespace {
std::atomic<uint64_t> g_direct_bytes{0}, g_direct_calls{0}, g_kernel_bytes{0}, g_kernel_calls{0};
}

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

bool read_peer(int pid, char* local, uint64_t remote, size_t bytes) {
  const void* from = reinterpret_cast<const void*>(remote);
  if (shared_heap::contains(from, bytes)) {
    // 128 KB memcpy calls: glibc's rep movsb writes whole destination lines without reading them first.
    copy_in_pieces(local, from, bytes);
    g_direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
    g_direct_calls.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  g_kernel_bytes.fetch_add(bytes, std::memory_order_relaxed);
  g_kernel_calls.fetch_add(1, std::memory_order_relaxed);
  return cma_copy(pid, local, remote, bytes, false);
}

PeerReads peer_reads() {
  return PeerReads{g_direct_bytes.load(), g_direct_calls.load(), g_kernel_bytes.load(), g_kernel_calls.load()};
}

}  // namespace mt::comm::shm
