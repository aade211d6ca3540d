#include "parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace mt::pipeline {

std::vector<int> balance_layers(const std::vector<double>& layer_cost, int stages, double first_extra,
                                double last_extra) {
  const int L = (int)layer_cost.size(), S = stages;
  MT_ASSERT(S >= 1, "balance_layers: ", S, " stages");
  std::vector<double> prefix(L + 1, 0.0);
  for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + layer_cost[l];
  auto cost = [&](int s, int a, int b) {  // stage s holds layers [a, b)
    return prefix[b] - prefix[a] + (s == 0 ? first_extra : 0.0) + (s == S - 1 ? last_extra : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][k]: the smallest possible maximum over stages s..S-1 when they hold layers [k, L).
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> take(S, std::vector<int>(L + 1, 0));
  best[S][L] = 0;
  for (int s = S - 1; s >= 0; s--) {
    for (int k = 0; k <= L; k++) {
      // Front first: the largest count wins ties (scan from large to small, replace only when better).
      for (int n = L - k; n >= 0; n--) {
        if (s == S - 1 && k + n != L) continue;
        double v = std::max(cost(s, k, k + n), best[s + 1][k + n]);
        if (v < best[s][k] * (1 - 1e-12)) {
          best[s][k] = v;
          take[s][k] = n;
        }
      }
    }
  }
  std::vector<int> counts(S);
  for (int s = 0, k = 0; s < S; s++) {
    counts[s] = take[s][k];
    k += counts[s];
  }
  return counts;
}

void check_stage_layers(const std::vector<int>& counts, int stages, int layers) {
  MT_CHECK_INPUT((int)counts.size() == stages, "--stage-layers gives ", counts.size(), " stage(s) but the pipeline ",
                 "has ", stages, " (--pp x --virtual-stages)");
  for (size_t s = 0; s < counts.size(); s++)
    MT_CHECK_INPUT(counts[s] >= 0, "--stage-layers: stage ", s, " has ", counts[s], " layers (must be >= 0)");
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  MT_CHECK_INPUT(total == layers, "--stage-layers adds up to ", total, " layers but the model has n_layer ", layers);
}

std::string describe_split(const std::vector<int>& counts) {
  std::string out;
  int l = 0;
  for (size_t s = 0; s < counts.size(); s++) {
    if (s) out += ' ';
    out += counts[s] == 0 ? std::string("[]")
           : counts[s] == 1 ? str("[", l, "]")
                            : str("[", l, "-", l + counts[s] - 1, "]");
    l += counts[s];
  }
  return out;
}

}  // namespace mt::pipeline
