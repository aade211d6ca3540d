#include "comm/shm/bind.h"

#include "core/env.h"

namespace mt::comm::shm {

int bind_cpu_for(int rank, int nranks, const cpu_set_t& allowed) {
  if (rank < 0 || nranks < 1 || rank >= nranks || nranks > CPU_COUNT(&allowed)) return -1;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ == rank) return cpu;
  }
  return -1;
}

int bind_rank_if_asked(int rank, int nranks) {
  if (!env_flag("MESHTRAIN_SHM_BIND").value_or(false)) return -1;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  const int cpu = bind_cpu_for(rank, nranks, allowed);
  if (cpu < 0) return -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0 ? cpu : -1;
}

}  // namespace mt::comm::shm
