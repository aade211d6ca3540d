// GEMM wrapper: every transpose combination against a naive product, single- and multi-threaded (the
// multi-threaded path splits C into row blocks, which must address op(A) correctly when A is transposed).
#include <gtest/gtest.h>

#include "tensor/blas.h"
#include "tests/unit/gradcheck.h"

class GemmTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override { mt::set_num_threads(1); }
};

TEST_P(GemmTest, MatchesNaiveForAllTransposes) {
  mt::set_num_threads(GetParam());
  const int M = 203, N = 77, K = 129;  // M not a multiple of the 8-row blocks
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      auto A = mt::testing::randn(M * K, 1, "A"), B = mt::testing::randn(K * N, 1, "B");
      auto C = mt::testing::randn(M * N, 1, "C");
      auto C0 = C;
      int lda = ta ? M : K, ldb = tb ? K : N;
      mt::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), N);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
          ASSERT_NEAR(C[i * N + j], 0.5 * s + 2.0 * C0[i * N + j], 1e-3) << ta << tb << " " << i << "," << j;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Threads, GemmTest, ::testing::Values(1, 2, 3));
