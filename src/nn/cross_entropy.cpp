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
float row_max(const float* x, int V) {
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int j = 1; j < V; j++) mx = std::max(mx, x[j]);
  return mx;
}

// Returns log(sum exp(x - max)) + max, the log-partition of one row.
float log_partition(const float* x, int V) {
  const float mx = row_max(x, V);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) sum += fast_exp(x[j] - mx);
  return mx + std::log(sum);
}
}  // namespace

double softmax_cross_entropy(float* logits, const int32_t* targets, int N, int V, float dscale, float* losses) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (num_threads() > 1)
  for (int n = 0; n < N; n++) {
    float* x = logits + (size_t)n * V;
    const float mx = row_max(x, V);
    const float xt = x[targets[n]];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) {
      float e = fast_exp(x[j] - mx);
      x[j] = e;
      sum += e;
    }
    const float loss = mx + std::log(sum) - xt;
    if (losses) losses[n] = loss;
    total += loss;
    const float f = dscale / sum;
#pragma omp simd
    for (int j = 0; j < V; j++) x[j] *= f;
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
