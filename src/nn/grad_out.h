// GradOut: where a backward kernel puts one parameter's gradient, and whether it adds to what is there or
// writes over it. A step's first write of a tensor overwrites (the buffer holds no value yet: see
// ParamRegistry::begin_grads), every later one (the next micro-batch, a second user of a tied weight) adds.
// Writing instead of adding saves zeroing the gradients before the step and, in a weight-gradient GEMM,
// reading the output once more. A plain pointer converts to an adding GradOut.
#pragma once

#include <cstddef>
#include <cstring>

namespace mt::nn {

struct GradOut {
  float* data = nullptr;
  bool overwrite = false;

  GradOut() = default;
  GradOut(std::nullptr_t) {}
  GradOut(float* d, bool ow = false) : data(d), overwrite(ow) {}  // NOLINT: implicit on purpose
  explicit operator bool() const { return data != nullptr; }
  // The GEMM's beta: C = A B (first write) or C += A B.
  float beta() const { return overwrite ? 0.0f : 1.0f; }
  // For kernels that add in several passes (a column sum, a scatter): the first write zeroes the n elements
  // first, so the result is the same bits as adding to a zeroed buffer.
  float* accumulator(size_t n) const {
    if (overwrite && data) std::memset(data, 0, sizeof(float) * n);
    return data;
  }
};

}  // namespace mt::nn
