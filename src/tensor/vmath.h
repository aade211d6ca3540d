// Vectorizable elementwise math. std::exp/std::tanh are scalar library calls that block the compiler's
// loop vectorizer; these inline versions compile to straight-line SIMD inside `#pragma omp simd` loops.
// Accuracy: fast_exp is within ~2 ulp of expf on [-87, 88] (Cody-Waite range reduction, then a degree-6
// Taylor polynomial on |r| <= ln2/2, truncation error < 1.2e-7 relative); inputs outside are clamped
// (exp(-87) ~ 1.6e-38, the smallest normal float).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace mt {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round x / ln2 to the nearest integer n by adding 1.5 * 2^23: the sum's low mantissa bits then hold n.
  // (floorf would block vectorization without -fno-trapping-math.)
  const float kShift = 12582912.0f;
  float t = x * 1.44269504088896341f + kShift;
  float n = t - kShift;
  int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  float r = x - n * 0.693145751953125f;  // ln2 split in two: the high part has few bits so n*hi is exact
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// The largest of x[0..n), n >= 1, sixteen lanes at a time (GCC's vector extension: vmaxps-class code on any
// x86 ISA). GCC 12 leaves an `omp simd reduction(max)` loop scalar in some of its copies (vmaxss, a 4-cycle
// chain per element). A NaN element loses every comparison, so NaNs are skipped as std::max skips them.
inline float max_of(const float* x, int n) {
  typedef float v16 __attribute__((vector_size(64)));
  v16 m;
  for (int l = 0; l < 16; l++) m[l] = x[0];
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    v16 v;
    std::memcpy(&v, x + j, sizeof(v));
    m = m < v ? v : m;
  }
  float mx = m[0];
  for (int l = 1; l < 16; l++) mx = mx < m[l] ? m[l] : mx;
  for (; j < n; j++) mx = mx < x[j] ? x[j] : mx;
  return mx;
}

// x[j] = exp(x[j] - shift) for j < n; returns their sum (a softmax's numerators and denominator). Out of line:
// inlined into an OpenMP region or a lambda's loop copy GCC 12 has left such loops scalar.
[[gnu::noinline]] inline float exp_sum_in_place(float* __restrict x, int n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    const float e = fast_exp(x[j] - shift);
    x[j] = e;
    sum += e;
  }
  return sum;
}

// tanh(z) = 1 - 2 / (exp(2z) + 1); absolute error ~1e-7, which is what GELU's (1 + tanh) needs.
inline float fast_tanh(float z) { return 1.0f - 2.0f / (fast_exp(2.0f * z) + 1.0f); }

}  // namespace mt
