#include "parallel/pipeline/in_flight_bound.h"

#include <algorithm>

#include "core/error.h"

namespace mt::pipeline {

int in_flight_bound(const ScheduleSpec& spec, int j) {
  const int p = spec.stages, m = spec.micro_batches, V = spec.virtual_stages;
  MT_ASSERT(j >= 0 && j < p, "in_flight_bound: rank ", j, " of ", p);
  const std::string& n = spec.name;
  if (n == "gpipe") return m * V;
  if (n == "1f1b" || n == "pipedream-2bw" || n == "pipedream" || n == "pipemare") return std::min(p - j, m);
  if (n == "interleaved") return std::min(2 * (p - j - 1) + (V - 1) * p + 1, V * m);
  if (n == "zb-h1") return std::min(p, m);
  if (n == "zb-h2") return std::min(2 * p - 1, m);
  if (n == "zb-v") return std::min(2 * p, 2 * m);
  if (n == "chimera") return std::min(p, m);
  return -1;
}

}  // namespace mt::pipeline
