// Each schedule's stated activation bound: the most (micro-batch, chunk) pairs rank j holds in flight at once,
// from a pair's forward to the end of its backward (a split one's weight half), as docs/parallelism.md states
// it per schedule. A table by name, written from the schedules' rules rather than read off their lists, so a
// test can hold the generators (and a run's measured activation store) to it.
//
//   gpipe                     m                    every forward before any backward
//   1f1b, pipedream-2bw,      min(p - j, m)        warm-up p - j - 1 forwards, then one in, one out
//   pipedream, pipemare
//   interleaved (V chunks)    min(2 (p - j - 1) + (V - 1) p + 1, V m)   Megatron's warm-up plus one
//   zb-h1                     min(p, m)            1F1B's peak (its rank 0's) on every rank
//   zb-h2                     min(2p - 1, m)
//   zb-v (2 chunks)           min(2p, 2m)          p whole stages' worth: 1F1B's peak; reached on every rank
//                                                  once m > p (its list may hold fewer below)
//   chimera (2 routes)        min(p, m)            at most p pairs over both routes' chunks; reached on
//                                                  every rank once m >= 2p (its greedy order holds fewer below)
#pragma once

#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {

// The bound for rank j (0 <= j < p) of a valid spec; -1 when the schedule states none (a name not in the table).
int in_flight_bound(const ScheduleSpec& spec, int j);

}  // namespace mt::pipeline
