// Softmax cross-entropy over a vocabulary, fused with its backward so the logits buffer [N,V] (the largest
// activation of a GPT) is reused for its gradient instead of allocating a second one. One row costs three
// passes over V floats (max; exp and sum, stored in place; scale), with one exp per element: the loss is
// log(sum) + max - x[target], read before the row is overwritten.
#include <algorithm>
#include <cmath>

#include "nn/layers.h"
#include "tensor/blas.h"
#include "tensor/vmath.h"

namespace mt::nn {

namespace {
// The row loops are functions of their own, kept out of line, and the max is vmath's max_of: with an omp simd
// max reduction inlined into the OpenMP region GCC 12 left it scalar (70% of softmax_cross_entropy's samples
// in a 1-thread gpt-bench profile).
[[gnu::noinline]] float row_max(const float* x, int V) { return max_of(x, V); }

// Returns log(sum exp(x - max)) + max, the log-partition of one row.
[[gnu::noinline]] float log_partition(const float* x, int V) {
  const float mx = row_max(x, V);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) sum += fast_exp(x[j] - mx);
  return mx + std::log(sum);
}

[[gnu::noinline]] void scale_in_place(float* __restrict x, int V, float f) {
#pragma omp simd
  for (int j = 0; j < V; j++) x[j] *= f;
}
}  // namespace

double softmax_cross_entropy(float* logits, const int32_t* targets, int N, int V, float dscale, float* losses) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (num_threads() > 1)
  for (int n = 0; n < N; n++) {
    float* x = logits + (size_t)n * V;
    const float mx = row_max(x, V);
    const float xt = x[targets[n]];
    const float sum = exp_sum_in_place(x, V, mx);
    const float loss = mx + std::log(sum) - xt;
    if (losses) losses[n] = loss;
    total += loss;
    scale_in_place(x, V, dscale / sum);
    x[targets[n]] -= dscale;
  }
  return total;
}

double cross_entropy_loss(const float* logits, const int32_t* targets, int N, int V, int64_t* correct) {
  double total = 0.0;
  int64_t hits = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, hits) if (num_threads() > 1)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * V;
    total += log_partition(x, V) - x[targets[n]];
    if (std::max_element(x, x + V) - x == targets[n]) hits++;
  }
  if (correct) *correct = hits;
  return total;
}

}  // namespace mt::nn
