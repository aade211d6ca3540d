// Core binding of the shm ranks: the rule (when a job's ranks bind, and to how many CPUs each) and the call.
// On the shared 2-core test host the single-copy collectives (process_vm_readv) had two speeds: about the copy bound
// when the two ranks ran on different cores, about twice the bound plus 10 us when the scheduler put both on one core
// and they took turns (bench/results/comm/a2av_mid_path_ab_loaded_2026-11-27_0433.txt). Binding rank r to CPUs of
// its own keeps them apart, and with it single copy wins from 32 KB (kCmaGatherMinBytesBound in shm_comm.h).
//
// The rule (the launcher decides once, before forking, so every rank of the job agrees; bind_width):
//   MESHTRAIN_SHM_BIND unset   bind when the job has at least 2 ranks and ranks x threads (the compute threads per
//                              rank, LaunchOptions::threads_per_rank = train's --threads) <= the CPUs this process
//                              may use: rank r gets the allowed CPUs numbered r*threads .. r*threads+threads-1,
//                              so each rank keeps room for all its threads. Never when oversubscribed: a bound
//                              rank could not move off a core another of its ranks (or threads) needs.
//   MESHTRAIN_SHM_BIND=1       bind whenever the ranks do not outnumber the allowed CPUs (also 1 rank), each rank
//                              to min(threads, allowed / ranks) CPUs (at least 1).
//   MESHTRAIN_SHM_BIND=0       never bind.
// What binding cannot do: move a rank away from another job's busy process on its CPUs (the scheduler no longer
// may), and the CPUs are counted in this process's affinity mask, not in what other jobs use.
#pragma once

#include <sched.h>

#include <optional>

namespace mt::comm::shm {

// CPUs each rank binds to (0: no binding) for `nranks` ranks of `threads` compute threads each, with `allowed` CPUs
// allowed; `asked` is MESHTRAIN_SHM_BIND (nullopt when unset). The rule above.
int bind_width(int nranks, int threads, int allowed, std::optional<bool> asked);

// The CPUs of rank `rank` bound `width` wide: the allowed CPUs numbered rank*width .. rank*width+width-1 in
// increasing order, into *out. False (and *out empty) when the allowed set has fewer CPUs or an argument is bad.
bool bind_cpus_for(int rank, int width, const cpu_set_t& allowed, cpu_set_t* out);

// The launcher's decision for a job: bind_width with this process's allowed CPUs and MESHTRAIN_SHM_BIND.
int job_bind_width(int nranks, int threads);

// Binds the calling process (rank `rank` of a job whose width is `width`). Returns the number of CPUs it is now
// bound to, or 0 when it did not bind (width 0, too few CPUs, or the kernel refused).
int bind_rank(int rank, int width);

}  // namespace mt::comm::shm
