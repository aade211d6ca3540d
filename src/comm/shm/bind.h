// Opt-in core binding of the shm ranks (MESHTRAIN_SHM_BIND=1; off by default).
// On the shared 2-core test host the single-copy collectives (process_vm_readv) had two speeds: about the copy bound
// when the two ranks ran on different cores, about twice the bound plus 10 us when the scheduler put both on one core
// and they took turns (bench/results/comm/a2av_mid_path_ab_loaded_2026-11-27_0433.txt). Binding rank r to the r-th
// CPU of the process's allowed set keeps them apart. It is off by default: a rank bound to one core confines every
// thread it starts (compute threads included) to that core, and a bound rank cannot move away from another busy
// process on its core.
#pragma once

#include <sched.h>

namespace mt::comm::shm {

// The CPU that rank `rank` of `nranks` binds to, chosen from `allowed`: the rank-th allowed CPU in increasing
// order; -1 (do not bind) when the ranks outnumber the allowed CPUs or the arguments are out of range.
int bind_cpu_for(int rank, int nranks, const cpu_set_t& allowed);

// With MESHTRAIN_SHM_BIND=1: binds the calling process (rank `rank` of `nranks` on this host) to bind_cpu_for's CPU.
// Returns that CPU, or -1 when it did not bind (the variable unset or 0, too few CPUs, or the kernel refused).
int bind_rank_if_asked(int rank, int nranks);

}  // namespace mt::comm::shm
