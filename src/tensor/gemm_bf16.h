// Internal to the GEMM backends (blas_onednn.cpp, blas_openblas.cpp): what they share for Precision::bf16.
#pragma once

#include "tensor/blas.h"

namespace mt::detail {

// The backend's own answer: does it have a bf16 kernel for this CPU, and its name ("avx512_core_bf16").
bool bf16_isa_native();
std::string bf16_isa_name();

// Precision::bf16 by emulation: A and B rounded to bf16 into this thread's float32 copies (packed, row
// stride = stored columns), then the float32 kernel on the copies. Cost over the float32 product: one pass
// over A and B, and copies of their size per thread (grown, never shrunk).
void gemm_bf16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc);
void gemm_bias_bf16_emulated(int M, int N, int K, const float* A, const float* B, const float* bias, float* C,
                             bool accumulate);
// The same with A already bf16: A widened to float32 into this thread's copy (exact), B rounded.
void gemm_a16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc);
// Both already bf16: both widened into this thread's copies (exact).
void gemm_16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                      const uint16_t* B16, int ldb, float beta, float* C, int ldc);
void gemm_bias_a16_emulated(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                            bool accumulate);
void gemm_bias_16_emulated(int M, int N, int K, const uint16_t* A16, const uint16_t* B16, const float* bias, float* C,
                           bool accumulate);

}  // namespace mt::detail
