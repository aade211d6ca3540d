#include "comm/shm/bind.h"

#include <algorithm>

#include "core/env.h"

namespace mt::comm::shm {

int bind_width(int nranks, int threads, int allowed, std::optional<bool> asked) {
  if (nranks < 1 || threads < 1 || allowed < 1) return 0;
  if (asked.has_value() && !*asked) return 0;
  if (asked.has_value()) return nranks <= allowed ? std::max(1, std::min(threads, allowed / nranks)) : 0;
  if (nranks < 2 || long(nranks) * threads > allowed) return 0;
  return threads;
}

bool bind_cpus_for(int rank, int width, const cpu_set_t& allowed, cpu_set_t* out) {
  CPU_ZERO(out);
  if (rank < 0 || width < 1 || long(rank + 1) * width > CPU_COUNT(&allowed)) return false;
  const int first = rank * width;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && seen < first + width; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ >= first) CPU_SET(cpu, out);
  }
  return true;
}

namespace {
int allowed_cpus(cpu_set_t* allowed) {
  CPU_ZERO(allowed);
  if (sched_getaffinity(0, sizeof *allowed, allowed) != 0) return 0;
  return CPU_COUNT(allowed);
}
}  // namespace

int job_bind_width(int nranks, int threads) {
  cpu_set_t allowed;
  return bind_width(nranks, threads, allowed_cpus(&allowed), env_flag("MESHTRAIN_SHM_BIND"));
}

int bind_rank(int rank, int width) {
  if (width < 1) return 0;
  cpu_set_t allowed, mine;
  allowed_cpus(&allowed);
  if (!bind_cpus_for(rank, width, allowed, &mine)) return 0;
  return sched_setaffinity(0, sizeof mine, &mine) == 0 ? width : 0;
}

}  // namespace mt::comm::shm
