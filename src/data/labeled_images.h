// Labeled images for classification (the MLP's, a CNN's next): IDX images (data/idx.h) with pixels scaled to
// [0, 1] and their labels, and the rule of which examples a step's global batch holds.
//
// Legend: N examples, D = rows x cols pixels, B global batch, s step.
//   batch rule   example j of step s's global batch is (s B + j) mod N: every rank computes the same rule
//                for its own windows [first, first + n), so data parallelism does not change the batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::data {

struct LabeledImages {
  int64_t count = 0;       // N
  int D = 0;               // pixels per image
  std::vector<float> x;    // [N, D] in [0, 1]
  std::vector<int32_t> y;  // [N]
  // Examples [first, first + n) of step s's global batch of B (the rule above): x_out[n, D], y_out[n].
  void batch(int64_t step, int B, int first, int n, float* x_out, int32_t* y_out) const;
  // Keeps examples [0, keep) and returns the rest (a held-out tail).
  LabeledImages split_tail(int64_t keep);
};

// Throws mt::InputError naming the files when labels is empty ("--labels / --val-labels": what the CLI
// calls them), the counts differ, or a label is not below n_classes.
LabeledImages load_labeled_images(const std::string& images, const std::string& labels, int n_classes);

}  // namespace mt::data
