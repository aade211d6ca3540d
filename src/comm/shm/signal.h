// Signal: a 32-bit counter in shared memory that one process advances and others wait on, with a deadline.
// Waiting spins briefly (the peer usually answers within microseconds when it has a core), then sleeps in
// FUTEX_WAIT (process-shared, so not FUTEX_PRIVATE) with a short timeout so that it can poll for a failed
// job and its deadline. The writer issues FUTEX_WAKE only when a waiter has announced itself, so the fast
// path is one store. Counters wrap; "reached" means (int32)(value - target) >= 0.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace mt::comm::shm {

struct alignas(64) Signal {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> waiters{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

using Clock = std::chrono::steady_clock;

// How long to wait actively before sleeping. Spinning is by time, not by count: a pause instruction costs
// very different amounts on different CPUs and hypervisors. After the spin, sched_yield() lets a peer that
// shares our core run; then FUTEX_WAIT. On a busy VM a futex wake-up took ~100 us, so when ranks have cores
// of their own the spin covers that. Oversubscribed jobs (more ranks than cores) spin only briefly: the
// peer cannot run until we give up the core.
struct SpinPolicy {
  int spin_us = 300;
  int yield_us = 2000;
  bool adaptive = true;  // the collectives' waits adapt their spin (next_spin_us); false: MESHTRAIN_SHM_SPIN fixed it
};
SpinPolicy spin_policy_for(int ranks_on_host);

// The collectives' spin adapts to what it buys (ShmCommunicator::wait_step): a spin pays only while the peer tends
// to arrive within it. When the host is loaded (more runnable threads than cores), the peer is often not running,
// every wait runs past the spin and the spin only burns the time slice the peer needs: 2 ranks, loaded 2-core KVM
// host (load average 10), all_gather and all_to_all_v at 1-4 MB ran at 0.04-0.17x the single-copy bound's speed in
// 17 of 18 rows with the fixed 300 us spin and at 0.69-1.01x with none (bench comm --bound, back to back;
// docs/performance.md). So after a wait of `waited_us`
// with a spin of `spin_us`: a wait within max(spin_us, kSpinProbeUs) doubles the spin (at least kSpinProbeUs, at
// most max_us: the peer arrives quickly, spinning catches it); a longer one halves it (to 0: yield at once).
constexpr int kSpinProbeUs = 10;
int next_spin_us(int spin_us, int max_us, double waited_us);

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// Stores v and wakes sleepers.
void signal_store(Signal& s, uint32_t v);
// Adds 1 and wakes sleepers.
void signal_bump(Signal& s);

// Waits until s.value reaches target. `poll` runs whenever the wait goes to sleep and then every few
// milliseconds; it throws to end the wait (failed job, passed deadline).
void signal_wait(Signal& s, uint32_t target, const SpinPolicy& spin, const std::function<void()>& poll);

}  // namespace mt::comm::shm
