// Cutting the layer sequence into pipeline stages.
//
// Legend: L layers (transformer blocks), S = p * V stages, c_l the estimated cost of layer l, e_first and
// e_last the extra cost the first and last stage carry (embeddings; final LayerNorm, logits and loss).
//
// balance_layers picks the contiguous split that minimises the most expensive stage,
//   max_s ( sum of c_l over stage s's layers + e_first [s = 0] + e_last [s = S - 1] ),
// exactly, by dynamic programming over (stage, layers so far) in O(S L^2). Among equally good splits it takes
// the one whose stages are filled front first (the first stage takes as many layers as the optimum allows),
// so identical layers with no extras split as evenly as L / S allows, larger stages first.
// A stage may hold no layers (L < S): it still runs, passing the activation on.
#pragma once

#include <string>
#include <vector>

namespace mt::pipeline {

// Layers per stage (S entries summing to L).
std::vector<int> balance_layers(const std::vector<double>& layer_cost, int stages, double first_extra,
                                double last_extra);

// `--stage-layers 2,3,3`: checks there is one count per stage, each >= 0, summing to L; throws InputError
// naming the flag otherwise.
void check_stage_layers(const std::vector<int>& counts, int stages, int layers);

// "[0-1] [2-4] [5-7]" (block indices per stage; "[]" for an empty stage).
std::string describe_split(const std::vector<int>& counts);

}  // namespace mt::pipeline
