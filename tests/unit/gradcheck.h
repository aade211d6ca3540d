// Finite-difference gradient checking for float32 kernels. The loss is L = sum(out * R) for a fixed random
// R (so every output element matters with a different weight), accumulated in double; the numerical
// derivative is the central difference (L(x+h) - L(x-h)) / 2h. In float32 the difference carries rounding
// of about 1e-7 * |out| per element, hence the step h = 1e-2 and the tolerance
// |num - ana| <= atol + rtol * max(|num|, |ana|) with atol 2e-3, rtol 2e-2 (see each test for exceptions).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"

namespace mt::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, const std::string& stream, float scale = 1.0f) {
  CounterRng rng(seed, stream);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)rng.normal(i) * scale;
  return v;
}

inline double dot(const float* a, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < r.size(); i++) s += (double)a[i] * r[i];
  return s;
}

// Checks ana[i] against d loss / d x[i] for every i in `indices` (all of x when empty).
inline void expect_grad(const std::string& what, std::vector<float>& x, const std::vector<float>& ana,
                        const std::function<double()>& loss, std::vector<size_t> indices = {}, float h = 1e-2f,
                        double atol = 2e-3, double rtol = 2e-2) {
  if (indices.empty())
    for (size_t i = 0; i < x.size(); i++) indices.push_back(i);
  int bad = 0;
  double worst = 0;
  for (size_t i : indices) {
    float orig = x[i];
    x[i] = orig + h;
    double lp = loss();
    x[i] = orig - h;
    double lm = loss();
    x[i] = orig;
    double num = (lp - lm) / (2.0 * h);
    double err = std::fabs(num - ana[i]);
    double tol = atol + rtol * std::max(std::fabs(num), std::fabs((double)ana[i]));
    worst = std::max(worst, err / tol);
    if (err > tol && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: numerical " << num << " vs analytical " << ana[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << indices.size() << " entries off (worst err/tol " << worst
                    << ")";
}

}  // namespace mt::testing
