// Matrix products and thread control; row-major throughout. Two backends, chosen at configure time with
// -DMESHTRAIN_BLAS=onednn (default: oneDNN matmul primitives, kernels picked from the instruction set the
// CPU reports) or =openblas (CBLAS; picks kernels from the CPU model, which hypervisors often hide).
// blas_onednn.cpp and blas_openblas.cpp hold one each; this header is all the rest of meshtrain sees.
#pragma once

#include <string>

namespace mt {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when trans_* is true.
// lda/ldb/ldc are the row strides of A, B, C as stored. Safe to call from inside an OpenMP parallel region
// (each call then runs on the calling thread only).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);

// C[M,N] = A[M,K] B[K,N] + bias[N] (+ C when accumulate): the bias is added by the product's kernel as it
// writes C (one pass over C instead of two). A, B, C contiguous.
void gemm_bias(int M, int N, int K, const float* A, const float* B, const float* bias, float* C, bool accumulate);

// Threads used by the GEMM library and by meshtrain's own OpenMP loops in this process.
void set_num_threads(int n);
int num_threads();

// What runs the products, for the run's first line and the benchmarks.
struct GemmKernel {
  std::string library;  // "oneDNN 2.6.3 (OpenMP)" or "OpenBLAS 0.3.21"
  std::string impl;     // the kernel: oneDNN's implementation name ("brg:avx512_core"), OpenBLAS's core name
  std::string isa;      // instruction set the kernel uses: "avx512", "avx2", "avx", "sse"
  std::string isa_detail;  // the library's own name for it ("avx512_core_bf16", "Cooperlake")
};
GemmKernel gemm_kernel();
// One line: "oneDNN 2.6.3 (OpenMP) matmul brg:avx512_core, ISA avx512 (avx512_core_bf16)".
std::string gemm_kernel_line();

}  // namespace mt
