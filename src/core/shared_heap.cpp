#include "core/shared_heap.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>

namespace mt::shared_heap {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kSliceAlign = size_t(2) << 20;
constexpr size_t kPunchMinBytes = size_t(64) << 10;

// Written only by create()/destroy() in the launcher (one thread, before the fork or after the ranks ended);
// read by every thread of a rank. Atomics so that contains() needs no lock.
std::atomic<char*> g_base{nullptr};
std::atomic<size_t> g_total{0};
std::atomic<size_t> g_slice_bytes{0};

struct Slice {
  std::mutex mu;
  char* begin = nullptr;
  size_t bytes = 0;
  std::map<size_t, size_t> free_runs;  // offset -> length, disjoint, never adjacent (merged on release)
  std::map<size_t, size_t> used;       // offset -> length of each live block
  Stats stats;
};
Slice g_slice;  // this process's slice (a rank's), empty elsewhere

}  // namespace

bool create(int ranks, size_t slice_bytes) {
  if (g_base.load() || ranks < 1) return false;
  slice_bytes = (slice_bytes + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  const size_t total = slice_bytes * size_t(ranks);
  // The address range first, then one shared mapping per slice over it: each slice is a mapping of its own in
  // /proc/self/smaps, so a rank can tell its peers' pages that it has mapped by reading them from its own
  // (peer_resident_bytes).
  void* p = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  for (int r = 0; r < ranks; ++r) {
    void* at = static_cast<char*>(p) + size_t(r) * slice_bytes;
    void* got = mmap(at, slice_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                     -1, 0);
    if (got != at) {
      munmap(p, total);
      return false;
    }
  }
  g_total.store(total);
  g_slice_bytes.store(slice_bytes);
  g_base.store(static_cast<char*>(p));
  std::lock_guard lk(g_slice.mu);
  g_slice.begin = nullptr;
  g_slice.bytes = slice_bytes;  // kept for enter_rank
  return true;
}

void destroy() {
  char* base = g_base.exchange(nullptr);
  if (base) munmap(base, g_total.load());
  g_total.store(0);
  g_slice_bytes.store(0);
  std::lock_guard lk(g_slice.mu);
  g_slice.begin = nullptr;
  g_slice.bytes = 0;
  g_slice.free_runs.clear();
  g_slice.used.clear();
  g_slice.stats = Stats{};
}

void enter_rank(int rank) {
  char* base = g_base.load();
  if (!base) return;
  std::lock_guard lk(g_slice.mu);
  g_slice.begin = base + size_t(rank) * g_slice.bytes;
  g_slice.free_runs.clear();
  g_slice.used.clear();
  g_slice.free_runs[0] = g_slice.bytes;
  g_slice.stats = Stats{};
}

void* allocate(size_t bytes) {
  if (bytes == 0) bytes = 1;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  Slice& s = g_slice;
  std::lock_guard lk(s.mu);
  if (!s.begin) return nullptr;
  // First fit from the lowest address: the slice's front stays dense and its tail untouched.
  for (auto it = s.free_runs.begin(); it != s.free_runs.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t off = it->first, len = it->second;
    s.free_runs.erase(it);
    if (len > bytes) s.free_runs[off + bytes] = len - bytes;
    s.used[off] = bytes;
    s.stats.live_bytes += bytes;
    s.stats.peak_bytes = std::max(s.stats.peak_bytes, s.stats.live_bytes);
    s.stats.blocks++;
    return s.begin + off;
  }
  return nullptr;
}

bool release(void* p) {
  if (!p || !contains(p, 1)) return false;
  Slice& s = g_slice;
  std::lock_guard lk(s.mu);
  char* c = static_cast<char*>(p);
  if (!s.begin || c < s.begin || c >= s.begin + s.bytes) return false;  // another rank's block: not ours to free
  auto u = s.used.find(size_t(c - s.begin));
  if (u == s.used.end()) return false;
  size_t off = u->first, len = u->second;
  s.used.erase(u);
  s.stats.live_bytes -= len;
  s.stats.blocks--;
  if (len >= kPunchMinBytes) madvise(c, len, MADV_REMOVE);  // the pages go back; a later block reads zeros
  // Merge with the free runs on either side.
  auto next = s.free_runs.lower_bound(off);
  if (next != s.free_runs.end() && next->first == off + len) {
    len += next->second;
    next = s.free_runs.erase(next);
  }
  if (next != s.free_runs.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return true;
    }
  }
  s.free_runs[off] = len;
  return true;
}

bool contains(const void* p, size_t bytes) {
  const char* base = g_base.load(std::memory_order_acquire);
  if (!base || bytes == 0) return false;
  const uintptr_t c = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
  const size_t total = g_total.load(std::memory_order_relaxed), sb = g_slice_bytes.load(std::memory_order_relaxed);
  if (c < b || c - b >= total || bytes > total - (c - b)) return false;
  return (c - b) / sb == (c - b + bytes - 1) / sb;  // the first and the last byte in the same slice
}

size_t peer_resident_bytes() {
  const uintptr_t base = reinterpret_cast<uintptr_t>(g_base.load());
  if (!base) return 0;
  const uintptr_t end = base + g_total.load();
  uintptr_t own_lo = 0, own_hi = 0;
  {
    std::lock_guard lk(g_slice.mu);
    if (g_slice.begin) {
      own_lo = reinterpret_cast<uintptr_t>(g_slice.begin);
      own_hi = own_lo + g_slice.bytes;
    }
  }
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  size_t bytes = 0;
  bool peer = false;  // the mapping whose fields follow lies in a peer's slice
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0, kb = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, ' ') &&
        std::strchr(line, '-') < std::strchr(line, ' ')) {
      peer = lo >= base && hi <= end && !(lo >= own_lo && hi <= own_hi);
    } else if (peer && std::sscanf(line, "Rss: %lu kB", &kb) == 1) {
      bytes += size_t(kb) * 1024;
    }
  }
  std::fclose(f);
  return bytes;
}

Stats stats() {
  std::lock_guard lk(g_slice.mu);
  return g_slice.stats;
}

}  // namespace mt::shared_heap
