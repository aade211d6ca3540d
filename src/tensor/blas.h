// Matrix products and thread control. All GEMMs go through CBLAS (OpenBLAS); row-major throughout.
#pragma once

namespace mt {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when trans_* is true.
// lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);

// Threads used by BLAS and by meshtrain's own loops in this process.
void set_num_threads(int n);
int num_threads();

}  // namespace mt
