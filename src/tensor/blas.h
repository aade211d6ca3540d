// Matrix products and thread control; row-major throughout. Two backends, chosen at configure time with
// -DMESHTRAIN_BLAS=onednn (default: oneDNN matmul primitives, kernels picked from the instruction set the
// CPU reports) or =openblas (CBLAS; picks kernels from the CPU model, which hypervisors often hide).
// blas_onednn.cpp and blas_openblas.cpp hold one each; this header is all the rest of meshtrain sees.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mt {

// The precision of a product's inputs, chosen per call (a model's products follow --precision; other products,
// such as PowerSGD's, stay float32). bf16: A and B are rounded to bfloat16 (nearest even, tensor/bf16.h),
// multiplied exactly and accumulated in float32; alpha, beta, the bias and C stay float32. Native on a CPU
// with bf16 dot-product instructions (oneDNN's avx512_core_bf16 or AMX kernels), else emulated: the inputs
// are rounded into float32 copies and multiplied by the float32 kernel (the same math, no speed gain).
// One known difference: vdpbf16ps treats bf16 denormal inputs (|x| < 1.2e-38) as zero and flushes denormal
// results, where the emulated path keeps them; training values never come near that range.
enum class Precision { fp32, bf16 };

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when trans_* is true.
// lda/ldb/ldc are the row strides of A, B, C as stored. Safe to call from inside an OpenMP parallel region
// (each call then runs on the calling thread only).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision prec = Precision::fp32);

// C[M,N] = A[M,K] B[K,N] + bias[N] (+ C when accumulate): the bias is added by the product's kernel as it
// writes C (one pass over C instead of two). A, B, C contiguous.
void gemm_bias(int M, int N, int K, const float* A, const float* B, const float* bias, float* C, bool accumulate,
               Precision prec = Precision::fp32);

// Precision::bf16 products whose A is already bfloat16 (A16, op(A16) as in gemm, row stride lda as stored): an
// input kept in bf16 (an activation saved for backward, rounded once in forward). The result is gemm(...,
// Precision::bf16) of the float32 values A16 holds, bit for bit, without rounding or packing A again.
void gemm_a16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);
// gemm_bias with A16[M,K] bf16 (contiguous): gemm_bias(..., Precision::bf16) of its float32 values.
void gemm_bias_a16(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                   bool accumulate);
// Both operands already bfloat16 (strides as stored): gemm(..., Precision::bf16) of the float32 values they
// hold. What lets a caller round an operand once and use it in several products (a linear layer's output
// gradient feeds both dX and dW; an attention head's q, k, v feed every tile) instead of once per product.
void gemm_16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
             const uint16_t* B16, int ldb, float beta, float* C, int ldc);
// gemm_bias with both A16[M,K] and B16[K,N] already bf16 (contiguous): gemm_bias(..., Precision::bf16) of the
// float32 values they hold (a layer input kept in bf16, or rounded once, times a weight's bf16 mirror).
void gemm_bias_16(int M, int N, int K, const uint16_t* A16, const uint16_t* B16, const float* bias, float* C,
                  bool accumulate);

// Whether Precision::bf16 products run on bf16 instructions here: the oneDNN backend on a CPU whose ISA has
// them, unless MESHTRAIN_BF16_EMULATE=1 (strict 0|1) or set_bf16_emulation(true) forces the emulated path.
bool bf16_native();
// "avx512_core_bf16" or "avx512_core_amx" (native), or "emulated": for the run's first line.
std::string bf16_kernel_name();
// Tests: force the emulated path (true), forbid forcing it (false), or back to MESHTRAIN_BF16_EMULATE (nullopt).
void set_bf16_emulation(std::optional<bool> force);

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
// One line: "oneDNN 2.6.3 (OpenMP) matmul brg:avx512_core, ISA avx512 (avx512_core_bf16), bf16: avx512_core_bf16".
std::string gemm_kernel_line();

}  // namespace mt
