#include "comm/shm/signal.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "comm/copy.h"
#include "core/env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MT_CPU_RELAX() _mm_pause()
#else
#define MT_CPU_RELAX() asm volatile("" ::: "memory")
#endif

namespace mt::comm::shm {

namespace {
constexpr long kSleepSliceNs = 5'000'000;  // how often a sleeping waiter polls for failures and deadlines

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, long ns) {
  timespec ts{0, ns};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
}  // namespace

SpinPolicy spin_policy_for(int ranks_on_host) {
  // MESHTRAIN_SHM_SPIN="spin_us,yield_us" overrides (tuning on a given machine).
  if (auto v = env_int_pair("MESHTRAIN_SHM_SPIN")) return {v->first, v->second, false};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  if (ranks_on_host > cores) return {2, 200};
  return {300, 2000};
}

int next_spin_us(int spin_us, int max_us, double waited_us) {
  if (waited_us <= std::max(spin_us, kSpinProbeUs)) return std::min(max_us, std::max(2 * spin_us, kSpinProbeUs));
  return spin_us / 2;
}

// Publishing fences first: data written with streaming stores (comm/copy.h copy_in) is not ordered
// before the counter by the seq_cst store alone.
void signal_store(Signal& s, uint32_t v) {
  stream_fence();
  s.value.store(v, std::memory_order_seq_cst);
  if (s.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&s.value);
}

void signal_bump(Signal& s) {
  stream_fence();
  s.value.fetch_add(1, std::memory_order_seq_cst);
  if (s.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&s.value);
}

void signal_wait(Signal& s, uint32_t target, const SpinPolicy& spin, const std::function<void()>& poll) {
  if (reached(s.value.load(std::memory_order_acquire), target)) return;
  const auto t0 = Clock::now();
  const auto spin_end = t0 + std::chrono::microseconds(spin.spin_us);
  const auto yield_end = spin_end + std::chrono::microseconds(spin.yield_us);
  for (int i = 1;; ++i) {
    if (reached(s.value.load(std::memory_order_acquire), target)) return;
    MT_CPU_RELAX();
    if ((i & 63) == 0 && Clock::now() >= spin_end) break;
  }
  while (Clock::now() < yield_end) {
    if (reached(s.value.load(std::memory_order_acquire), target)) return;
    sched_yield();
  }
  // Announce ourselves before the final check (seq_cst on both sides: either the writer sees waiters != 0
  // and wakes us, or we see its value).
  s.waiters.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    Signal& s;
    ~Leave() { s.waiters.fetch_sub(1, std::memory_order_seq_cst); }
  } leave{s};
  for (;;) {
    uint32_t v = s.value.load(std::memory_order_seq_cst);
    if (reached(v, target)) break;
    poll();
    futex_wait(&s.value, v, kSleepSliceNs);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

}  // namespace mt::comm::shm
