// GEMM through CBLAS (the -DMESHTRAIN_BLAS=openblas backend; see blas.h), parallelized by meshtrain rather than by OpenBLAS: OpenBLAS always runs one thread per
// call, and a multi-threaded GEMM is split into row blocks of C across the OpenMP team. One thread pool
// (OpenMP's) then serves GEMMs and meshtrain's own loops alike; with OpenBLAS's own pool as well, its
// spinning workers and OpenMP's would compete for the same cores between calls.
#include "tensor/blas.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "tensor/gemm_bf16.h"

namespace mt {

namespace {

int g_threads = 1;

void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

namespace detail {

// CBLAS has no bf16 product: Precision::bf16 always takes the emulated path.
bool bf16_isa_native() { return false; }
std::string bf16_isa_name() { return "emulated"; }

}  // namespace detail

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision prec) {
  if (M == 0 || N == 0) return;
  if (prec == Precision::bf16)
    return detail::gemm_bf16_emulated(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const int nt = g_threads;
  // Below ~1 MFLOP per thread, or inside a parallel region (attention heads), one thread does it all.
  if (nt <= 1 || omp_in_parallel() || (double)M * N * K < 1e6 * nt || M < 16 * nt) {
    gemm_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    // Row blocks of C, multiples of 8 rows so each block keeps the kernel's full register tiles.
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int per = (M + n - 1) / n;
    per = (per + 7) / 8 * 8;
    int m0 = std::min(M, t * per), m1 = std::min(M, m0 + per);
    if (m1 > m0) {
      // Row m of op(A) is row m of A, or column m of A when A is stored transposed.
      const float* a = trans_a ? A + m0 : A + (size_t)m0 * lda;
      gemm_serial(trans_a, trans_b, m1 - m0, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)m0 * ldc, ldc);
    }
  }
}

// A already bf16: the emulated path, as every bf16 product here.
void gemm_a16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  detail::gemm_a16_emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B, ldb, beta, C, ldc);
}

void gemm_16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
             const uint16_t* B16, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  detail::gemm_16_emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc);
}

void gemm_bias_a16(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                   bool accumulate) {
  detail::gemm_bias_a16_emulated(M, N, K, A16, B, bias, C, accumulate);
}

void gemm_bias_16(int M, int N, int K, const uint16_t* A16, const uint16_t* B16, const float* bias, float* C,
                  bool accumulate) {
  detail::gemm_bias_16_emulated(M, N, K, A16, B16, bias, C, accumulate);
}

void gemm_bias(int M, int N, int K, const float* A, const float* B, const float* bias, float* C, bool accumulate,
               Precision prec) {
  if (prec == Precision::bf16) return detail::gemm_bias_bf16_emulated(M, N, K, A, B, bias, C, accumulate);
    // CBLAS has no epilogue: write (or add) the bias first, then accumulate the product on top (beta = 1).
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++) {
    float* c = C + (size_t)i * N;
    if (accumulate) {
      for (int j = 0; j < N; j++) c[j] += bias[j];
    } else {
      for (int j = 0; j < N; j++) c[j] = bias[j];
    }
  }
  gemm(false, false, M, N, K, 1.0f, A, K, B, N, 1.0f, C, N);
}

void set_num_threads(int n) {
  MT_CHECK_INPUT(n >= 1, "--threads must be >= 1, got ", n);
  g_threads = n;
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

int num_threads() { return g_threads; }

GemmKernel gemm_kernel() {
  GemmKernel k;
  k.library = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 "
  k.library = k.library.substr(k.library.find_first_not_of(' '));
  k.library.erase(k.library.find_last_not_of(' ') + 1);
  k.impl = openblas_get_corename();
  if (const char* ct = std::getenv("OPENBLAS_CORETYPE")) k.impl += str(" (OPENBLAS_CORETYPE=", ct, ")");
  k.isa_detail = openblas_get_corename();
  // OpenBLAS names kernels after CPU models: the instruction set each model's kernels use.
  const std::string& c = k.isa_detail;
  if (c == "SkylakeX" || c == "Cooperlake" || c == "SapphireRapids")
    k.isa = "avx512";
  else if (c == "Haswell" || c == "Zen")
    k.isa = "avx2";
  else if (c == "Sandybridge")
    k.isa = "avx";
  else
    k.isa = "sse";
  return k;
}

std::string gemm_kernel_line() {
  GemmKernel k = gemm_kernel();
  return str(k.library, " core ", k.impl, ", ISA ", k.isa, ", bf16: ", bf16_kernel_name());
}

}  // namespace mt
