// Linear layer: three GEMMs (forward with the bias fused, input gradient, weight gradient) and a bias reduction.
#include <cstring>

#include "nn/layers.h"
#include "tensor/blas.h"

namespace mt::nn {

void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int C, int OC,
                    const float* residual, Precision prec) {
  if (b) {
    // The bias is added by the GEMM kernel as it writes out; a residual is copied in first and summed onto.
    if (residual && residual != out) std::memcpy(out, residual, sizeof(float) * N * OC);
    gemm_bias(N, OC, C, inp, W, b, out, residual != nullptr, prec);
    return;
  }
  if (residual && residual != out) std::memcpy(out, residual, sizeof(float) * N * OC);
  gemm(false, false, N, OC, C, 1.0f, inp, C, W, OC, residual ? 1.0f : 0.0f, out, OC, prec);
}

void linear_backward(float* dinp, GradOut dW, GradOut db_out, const float* dout, const float* inp, const float* W,
                     int N, int C, int OC, bool accumulate_dinp, Precision prec) {
  if (dinp) gemm(false, true, N, C, OC, 1.0f, dout, OC, W, OC, accumulate_dinp ? 1.0f : 0.0f, dinp, C, prec);
  gemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, dW.beta(), dW.data, OC, prec);
  if (float* db = db_out.accumulator(OC)) {
    for (int n = 0; n < N; n++) {
      const float* d = dout + (size_t)n * OC;
#pragma omp simd
      for (int j = 0; j < OC; j++) db[j] += d[j];
    }
  }
}

}  // namespace mt::nn
