// GEMM through CBLAS, parallelized by meshtrain rather than by OpenBLAS: OpenBLAS always runs one thread per
// call, and a multi-threaded GEMM is split into row blocks of C across the OpenMP team. One thread pool
// (OpenMP's) then serves GEMMs and meshtrain's own loops alike; with OpenBLAS's own pool as well, its
// spinning workers and OpenMP's would compete for the same cores between calls.
#include "tensor/blas.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "core/error.h"

namespace mt {

namespace {

int g_threads = 1;

void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
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

void set_num_threads(int n) {
  MT_CHECK_INPUT(n >= 1, "--threads must be >= 1, got ", n);
  g_threads = n;
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

int num_threads() { return g_threads; }

}  // namespace mt
