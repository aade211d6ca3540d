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
};
SpinPolicy spin_policy_for(int ranks_on_host);

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// Stores v and wakes sleepers.
void signal_store(Signal& s, uint32_t v);
// Adds 1 and wakes sleepers.
void signal_bump(Signal& s);

// Waits until s.value reaches target. `poll` runs whenever the wait goes to sleep and then every few
// milliseconds; it throws to end the wait (failed job, passed deadline).
void signal_wait(Signal& s, uint32_t target, const SpinPolicy& spin, const std::function<void()>& poll);

}  // namespace mt::comm::shm
