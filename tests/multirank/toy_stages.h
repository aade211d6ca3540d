// The toy pipeline model of the window executor tests (no_flush_executor_test.cpp, sync_window_executor_test.cpp):
// what does not depend on the rule under test. Legend: s a stage, i a micro-batch, n = kN floats per activation.
// Stage s maps x to y = a_s x + b_s element-wise; micro-batch i enters as x_k = 0.25 ((i mod 7) + 1) + 0.125 k;
// W(0): a_s = 1 + s / 8, b_s = s / 16 - 1 / 4. The backward (whole or in halves) and the update stay with each
// test.
#pragma once

#include <utility>
#include <vector>

namespace mt::toy {

constexpr int kN = 5;

using Params = std::pair<float, float>;  // (a, b)

inline Params init_of(int s) { return {1.0f + 0.125f * (float)s, 0.0625f * (float)s - 0.25f}; }
inline std::vector<float> input_of(int i) {
  std::vector<float> x(kN);
  for (int k = 0; k < kN; k++) x[k] = 0.25f * (float)(i % 7 + 1) + 0.125f * (float)k;
  return x;
}

// One compiled copy of the arithmetic for the serial run and the runner, so equality can be exact.
__attribute__((noinline)) inline std::vector<float> stage_forward(Params w, const std::vector<float>& x) {
  std::vector<float> y(kN);
  for (int k = 0; k < kN; k++) y[k] = w.first * x[k] + w.second;
  return y;
}
// The stage's part of the squared global gradient norm.
__attribute__((noinline)) inline double norm_part(Params g) {
  return (double)g.first * g.first + (double)g.second * g.second;
}

}  // namespace mt::toy
