// Linear layer: three GEMMs (forward, input gradient, weight gradient) and a bias reduction.
#include "nn/layers.h"
#include "tensor/blas.h"

namespace mt::nn {

void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int C, int OC,
                    const float* residual) {
  if (b || residual) {
    // Write bias (+ residual) into out, then accumulate the product on top (beta = 1): one pass over out.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      float* o = out + (size_t)n * OC;
      const float* r = residual ? residual + (size_t)n * OC : nullptr;
      if (b && r) {
        for (int j = 0; j < OC; j++) o[j] = r[j] + b[j];
      } else if (b) {
        for (int j = 0; j < OC; j++) o[j] = b[j];
      } else if (r != o) {
        for (int j = 0; j < OC; j++) o[j] = r[j];
      }
    }
  }
  gemm(false, false, N, OC, C, 1.0f, inp, C, W, OC, (b || residual) ? 1.0f : 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                     int C, int OC, bool accumulate_dinp) {
  if (dinp) gemm(false, true, N, C, OC, 1.0f, dout, OC, W, OC, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
  gemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dW, OC);
  if (db) {
    for (int n = 0; n < N; n++) {
      const float* d = dout + (size_t)n * OC;
#pragma omp simd
      for (int j = 0; j < OC; j++) db[j] += d[j];
    }
  }
}

}  // namespace mt::nn
