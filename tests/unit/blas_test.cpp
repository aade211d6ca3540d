// GEMM wrapper: every transpose combination against a naive product, single- and multi-threaded (the
// multi-threaded path splits C into row blocks, which must address op(A) correctly when A is transposed);
// the fused bias epilogue; calls from inside a parallel region; the instruction set of the kernel in use.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

// Fused bias epilogue against the naive product plus bias, written fresh and accumulated.
TEST_P(GemmTest, BiasEpilogueMatchesNaive) {
  mt::set_num_threads(GetParam());
  const int M = 70, N = 45, K = 33;
  auto A = mt::testing::randn(M * K, 1, "A"), B = mt::testing::randn(K * N, 1, "B");
  auto bias = mt::testing::randn(N, 1, "bias"), C0 = mt::testing::randn(M * N, 1, "C");
  for (int acc = 0; acc < 2; acc++) {
    auto C = C0;
    mt::gemm_bias(M, N, K, A.data(), B.data(), bias.data(), C.data(), acc);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = bias[j] + (acc ? C0[i * N + j] : 0.0);
        for (int k = 0; k < K; k++) s += (double)A[i * K + k] * B[k * N + j];
        ASSERT_NEAR(C[i * N + j], s, 1e-4) << "accumulate " << acc << " at " << i << "," << j;
      }
  }
}

// Products called from inside a parallel region (as attention does per head) run on the calling thread
// and give the same results as outside one.
TEST(Gemm, InsideParallelRegionMatchesOutside) {
  mt::set_num_threads(2);
  const int M = 64, N = 96, K = 40;
  auto A = mt::testing::randn(M * K, 1, "A"), B = mt::testing::randn(K * N, 1, "B");
  std::vector<float> ref(M * N), in(2 * M * N);
  mt::gemm(false, true, M, N, K, 0.25f, A.data(), K, B.data(), K, 0.0f, ref.data(), N);
#pragma omp parallel for num_threads(2)
  for (int t = 0; t < 2; t++)
    mt::gemm(false, true, M, N, K, 0.25f, A.data(), K, B.data(), K, 0.0f, in.data() + (size_t)t * M * N, N);
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < M * N; i++) ASSERT_NEAR(in[(size_t)t * M * N + i], ref[i], 1e-5) << "thread " << t << " " << i;
  mt::set_num_threads(1);
}

namespace {
// The CPU's feature flags as the kernel reports them (/proc/cpuinfo "flags" line of the first CPU).
std::set<std::string> cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  return flags;
}
}  // namespace

// The GEMM kernel uses the widest vector instructions the CPU has: AVX-512 where the CPU has AVX-512F, else
// AVX2 where it has AVX2 and FMA (the failure this guards against: a hidden CPU model sending OpenBLAS to
// its SSE3 kernels). A variable that caps the instruction set on purpose skips the check.
TEST(Gemm, KernelUsesTheWidestInstructionSet) {
  for (const char* v : {"OPENBLAS_CORETYPE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (std::getenv(v)) GTEST_SKIP() << v << " is set: the instruction set is capped on purpose";
  std::set<std::string> flags = cpu_flags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  mt::set_num_threads(1);
  std::vector<float> A(128 * 128, 1.0f), C(128 * 128);
  mt::gemm(false, false, 128, 128, 128, 1.0f, A.data(), 128, A.data(), 128, 0.0f, C.data(), 128);
  ASSERT_EQ(C[0], 128.0f);
  mt::GemmKernel k = mt::gemm_kernel();
  std::string line = mt::gemm_kernel_line();
  // No product of this binary's tests fell back to oneDNN's plain C++ reference kernels ("ref:any").
  EXPECT_EQ(k.impl.find("ref:"), std::string::npos) << line;
  if (flags.count("avx512f")) {
    EXPECT_EQ(k.isa, "avx512") << line;
#ifndef MESHTRAIN_BLAS_OPENBLAS
    EXPECT_NE(k.impl.find("avx512"), std::string::npos) << "oneDNN's implementation: " << line;
#endif
  } else if (flags.count("avx2") && flags.count("fma")) {
    EXPECT_EQ(k.isa, "avx2") << line;
#ifndef MESHTRAIN_BLAS_OPENBLAS
    EXPECT_NE(k.impl.find("avx2"), std::string::npos) << "oneDNN's implementation: " << line;
#endif
  } else {
    GTEST_SKIP() << "CPU has neither AVX-512F nor AVX2+FMA";
  }
}
