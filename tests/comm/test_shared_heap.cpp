// The shared heap (core/shared_heap.h): its allocator in one process, and the single-copy collectives reading
// peers' buffers there with ordinary loads (comm/shm/cma.h read_peer) in forked shm jobs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/launch.h"
#include "comm/shm/cma.h"
#include "core/shared_heap.h"
#include "tests/comm/comm_checks.h"
#include "tests/comm/shm_launch.h"

namespace mt {
namespace {

using namespace mt::comm;
using namespace mt::comm::testing;

constexpr size_t kSlice = size_t(4) << 20;  // rounded up to 4 MB slices (2 MB multiples)

TEST(SharedHeap, NoHeapMeansNullAndNotContained) {
  EXPECT_EQ(shared_heap::allocate(4096), nullptr);
  void* p = std::malloc(64);
  EXPECT_FALSE(shared_heap::contains(p, 64));
  EXPECT_FALSE(shared_heap::release(p));  // not the heap's: the caller frees it
  std::free(p);
}

TEST(SharedHeap, FirstFitMergesAndFills) {
  ASSERT_TRUE(shared_heap::create(3, kSlice));
  EXPECT_EQ(shared_heap::allocate(4096), nullptr) << "a process that is not a rank allocates nothing";
  shared_heap::enter_rank(1);
  char* a = static_cast<char*>(shared_heap::allocate(100));  // rounded up to one page
  char* b = static_cast<char*>(shared_heap::allocate(5000));  // two pages
  char* c = static_cast<char*>(shared_heap::allocate(4096));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 4096, 0u);
  EXPECT_EQ(b, a + 4096);
  EXPECT_EQ(c, b + 8192);
  EXPECT_TRUE(shared_heap::contains(a, 100));
  // Slice 1 of 3: its first byte is one slice above slice 0's; a range across the slices' border is not contained.
  EXPECT_TRUE(shared_heap::contains(a - kSlice, 1));
  EXPECT_FALSE(shared_heap::contains(a - 1, 2));
  EXPECT_FALSE(shared_heap::contains(a + 2 * kSlice, 1)) << "past the last slice";
  EXPECT_EQ(shared_heap::stats().live_bytes, 4u * 4096);
  EXPECT_EQ(shared_heap::stats().blocks, 3u);
  // Released b's two pages are found first by a block that fits them.
  EXPECT_TRUE(shared_heap::release(b));
  EXPECT_EQ(shared_heap::allocate(8192), b);
  EXPECT_TRUE(shared_heap::release(b));
  EXPECT_FALSE(shared_heap::release(b + 4096)) << "not the start of a live block";
  EXPECT_FALSE(shared_heap::release(a - kSlice)) << "another rank's slice";
  // Everything back: the runs merge into the whole slice again.
  EXPECT_TRUE(shared_heap::release(a));
  EXPECT_TRUE(shared_heap::release(c));
  EXPECT_EQ(shared_heap::stats().live_bytes, 0u);
  EXPECT_EQ(shared_heap::stats().peak_bytes, 4u * 4096);
  char* all = static_cast<char*>(shared_heap::allocate(kSlice));
  EXPECT_EQ(all, a);
  EXPECT_EQ(shared_heap::allocate(1), nullptr) << "the slice is full";
  EXPECT_TRUE(shared_heap::release(all));
  shared_heap::destroy();
  EXPECT_FALSE(shared_heap::contains(a, 1));
}

TEST(SharedHeap, ReleasedLargeBlocksGiveTheirPagesBack) {
  ASSERT_TRUE(shared_heap::create(1, kSlice));
  shared_heap::enter_rank(0);
  const size_t big = size_t(64) << 10;
  char* p = static_cast<char*>(shared_heap::allocate(big));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5A, big);
  ASSERT_TRUE(shared_heap::release(p));
  char* q = static_cast<char*>(shared_heap::allocate(big));
  ASSERT_EQ(q, p);
  size_t nonzero = 0;
  for (size_t i = 0; i < big; ++i) nonzero += q[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "a released 64 KB block was not punched (MADV_REMOVE)";
  shared_heap::release(q);
  shared_heap::destroy();
}

// A block one rank writes is read by another process at the same address (made before the fork).
// Forks a process that enters the heap as rank 1, allocates `bytes`, fills them and ends; returns the block's address
// (the same in this process: the heap was mapped before the fork), 0 when something failed.
template <class Fill>
uintptr_t block_of_forked_rank1(size_t bytes, Fill fill) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  const pid_t pid = fork();
  if (pid == 0) {
    shared_heap::enter_rank(1);
    char* p = static_cast<char*>(shared_heap::allocate(bytes));
    if (p) fill(p);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    _exit(write(fds[1], &at, sizeof at) == sizeof at ? 0 : 1);
  }
  uintptr_t at = 0;
  if (pid < 0 || read(fds[0], &at, sizeof at) != ssize_t(sizeof at)) at = 0;
  int st = 0;
  if (pid > 0) waitpid(pid, &st, 0);
  close(fds[0]);
  close(fds[1]);
  return at;
}

// A peer's pages that this process reads count in its RSS; peer_resident_bytes says how many, not counting its own.
TEST(SharedHeap, PeerPagesReadAreCountedApart) {
  ASSERT_TRUE(shared_heap::create(2, kSlice));
  const size_t mb = size_t(1) << 20;
  const uintptr_t at = block_of_forked_rank1(mb, [&](char* p) { std::memset(p, 1, mb); });
  ASSERT_NE(at, 0u);
  shared_heap::enter_rank(0);
  char* own = static_cast<char*>(shared_heap::allocate(2 * mb));
  ASSERT_NE(own, nullptr);
  std::memset(own, 2, 2 * mb);  // this process's own pages: not a peer's
  EXPECT_EQ(shared_heap::peer_resident_bytes(), 0u);
  const volatile char* peer = reinterpret_cast<const char*>(at);
  size_t sum = 0;
  for (size_t i = 0; i < mb; i += 4096) sum += peer[i];
  EXPECT_EQ(sum, mb / 4096);
  EXPECT_EQ(shared_heap::peer_resident_bytes(), mb);
  shared_heap::release(own);
  shared_heap::destroy();
}

TEST(SharedHeap, ForkedRanksSeeEachOthersBlocks) {
  ASSERT_TRUE(shared_heap::create(2, kSlice));
  const uintptr_t at = block_of_forked_rank1(4096, [](char* p) { std::memcpy(p, "rank one", 9); });
  ASSERT_NE(at, 0u);
  EXPECT_TRUE(shared_heap::contains(reinterpret_cast<void*>(at), 9));
  EXPECT_STREQ(reinterpret_cast<const char*>(at), "rank one");
  shared_heap::destroy();
}

// The single-copy collectives on buffers in the heap: results against the reference, and every peer read by ordinary
// loads (none through the kernel). Single copy from 32 KB whatever the binding, so the path does not depend on the
// machine's load.
void run_on_heap_buffers(int n, bool heap) {
  setenv("MESHTRAIN_SHM_CMA_GATHER_KB", "32", 1);
  if (!heap) setenv("MESHTRAIN_SHARED_HEAP_MB", "0", 1);
  LaunchResult res = run_ranks(shm_opts(n), [heap](Communicator& w) {
    SharedBufs on;  // comm_checks' Buf allocates in the heap in this scope
    const shm::PeerReads before = shm::peer_reads();
    for (size_t s : {size_t{70'001}, size_t{600'000}}) {
      check_all_gather(w, s, DType::f32, false);
      check_all_gather(w, s, DType::bf16, true);
      check_all_to_all(w, s / size_t(w.size()), DType::f32, false);
      check_all_to_all_v(w, s / 8, DType::f32);
      check_broadcast(w, s, DType::f32, w.size() - 1);
    }
    const shm::PeerReads after = shm::peer_reads();
    const uint64_t direct = after.direct_bytes - before.direct_bytes, kernel = after.kernel_bytes - before.kernel_bytes;
    if (heap && (direct == 0 || kernel != 0))
      throw Error(str("rank ", w.rank(), ": ", direct, " bytes read from the heap, ", kernel, " through the kernel"));
    if (!heap && (direct != 0 || kernel == 0))
      throw Error(str("rank ", w.rank(), " without a heap: ", direct, " bytes read as from the heap, ", kernel,
                      " through the kernel"));
  });
  unsetenv("MESHTRAIN_SHM_CMA_GATHER_KB");
  unsetenv("MESHTRAIN_SHARED_HEAP_MB");
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

TEST(SharedHeapCollectives, TwoRanksReadPeersWithLoads) { run_on_heap_buffers(2, true); }
TEST(SharedHeapCollectives, ThreeRanksReadPeersWithLoads) { run_on_heap_buffers(3, true); }
TEST(SharedHeapCollectives, WithoutHeapTheKernelReads) { run_on_heap_buffers(2, false); }

}  // namespace
}  // namespace mt
