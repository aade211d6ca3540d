#include "tensor/blas.h"

#include <cblas.h>
#include <omp.h>

#include "core/error.h"

namespace mt {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

static int g_threads = 1;

void set_num_threads(int n) {
  MT_CHECK_INPUT(n >= 1, "--threads must be >= 1, got ", n);
  g_threads = n;
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

int num_threads() { return g_threads; }

}  // namespace mt
