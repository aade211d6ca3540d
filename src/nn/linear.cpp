// Linear layer: three GEMMs (forward with the bias fused, input gradient, weight gradient) and a bias reduction.
#include <cstring>

#include "nn/layers.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"

namespace mt::nn {

namespace {

// The product with A as the layer holds it: float32 (rounded by the product under bf16) or kept in bf16.
void product(bool ta, int M, int N, int K, const float* A, int lda, const float* B, float beta, float* C,
             Precision prec) {
  gemm(ta, false, M, N, K, 1.0f, A, lda, B, N, beta, C, N, prec);
}
void product(bool ta, int M, int N, int K, const uint16_t* A, int lda, const float* B, float beta, float* C,
             Precision) {
  gemm_a16(ta, false, M, N, K, 1.0f, A, lda, B, N, beta, C, N);
}
void product_bias(int M, int N, int K, const float* A, const float* B, const float* b, float* C, bool acc,
                  Precision prec) {
  gemm_bias(M, N, K, A, B, b, C, acc, prec);
}
void product_bias(int M, int N, int K, const uint16_t* A, const float* B, const float* b, float* C, bool acc,
                  Precision) {
  gemm_bias_a16(M, N, K, A, B, b, C, acc);
}

const uint16_t* as_bf16(const float* x, int rows, int cols) { return packed_bf16_scratch(1, x, rows, cols, cols); }
const uint16_t* as_bf16(const uint16_t* x16, int, int) { return x16; }

template <class In>
void forward(float* out, const In* inp, Weight W, const float* b, int N, int C, int OC, const float* residual,
             Precision prec) {
  // The bias is added by the GEMM kernel as it writes out; a residual is copied in first and summed onto.
  if (residual && residual != out) std::memcpy(out, residual, sizeof(float) * N * OC);
  if (prec == Precision::bf16 && W.b16) {  // the weight's mirror: no rounding pass over W
    const uint16_t* x16 = as_bf16(inp, N, C);
    if (b) return gemm_bias_16(N, OC, C, x16, W.b16, b, out, residual != nullptr);
    return gemm_16(false, false, N, OC, C, 1.0f, x16, C, W.b16, OC, residual ? 1.0f : 0.0f, out, OC);
  }
  if (b) return product_bias(N, OC, C, inp, W.f32, b, out, residual != nullptr, prec);
  product(false, N, OC, C, inp, C, W.f32, residual ? 1.0f : 0.0f, out, prec);
}

template <class In>
void backward(float* dinp, GradOut dW, GradOut db_out, const float* dout, const In* inp, Weight W, int N, int C,
              int OC, bool accumulate_dinp, Precision prec) {
  if (prec == Precision::bf16) {
    // dout feeds both products: rounded once here, not once per product (one pass over N x OC fewer).
    const uint16_t* d16 = packed_bf16_scratch(0, dout, N, OC, OC);
    const float beta = accumulate_dinp ? 1.0f : 0.0f;
    if (dinp && W.b16)  // the weight's mirror: no rounding pass over W
      gemm_16(false, true, N, C, OC, 1.0f, d16, OC, W.b16, OC, beta, dinp, C);
    else if (dinp)
      gemm_a16(false, true, N, C, OC, 1.0f, d16, OC, W.f32, OC, beta, dinp, C);
    if (dW) gemm_16(true, false, C, OC, N, 1.0f, as_bf16(inp, N, C), C, d16, OC, dW.beta(), dW.data, OC);
  } else {
    if (dinp) gemm(false, true, N, C, OC, 1.0f, dout, OC, W.f32, OC, accumulate_dinp ? 1.0f : 0.0f, dinp, C, prec);
    if (dW) product(true, C, OC, N, inp, C, dout, dW.beta(), dW.data, prec);
  }
  if (float* db = db_out.accumulator(OC)) {
    for (int n = 0; n < N; n++) {
      const float* d = dout + (size_t)n * OC;
#pragma omp simd
      for (int j = 0; j < OC; j++) db[j] += d[j];
    }
  }
}

}  // namespace

void linear_forward(float* out, const float* inp, Weight W, const float* b, int N, int C, int OC,
                    const float* residual, Precision prec) {
  forward(out, inp, W, b, N, C, OC, residual, prec);
}
void linear_forward(float* out, const uint16_t* inp, Weight W, const float* b, int N, int C, int OC,
                    const float* residual) {
  forward(out, inp, W, b, N, C, OC, residual, Precision::bf16);
}

void linear_backward(float* dinp, GradOut dW, GradOut db, const float* dout, const float* inp, Weight W, int N,
                     int C, int OC, bool accumulate_dinp, Precision prec) {
  backward(dinp, dW, db, dout, inp, W, N, C, OC, accumulate_dinp, prec);
}
void linear_backward(float* dinp, GradOut dW, GradOut db, const float* dout, const uint16_t* inp, Weight W, int N,
                     int C, int OC, bool accumulate_dinp) {
  backward(dinp, dW, db, dout, inp, W, N, C, OC, accumulate_dinp, Precision::bf16);
}

}  // namespace mt::nn
