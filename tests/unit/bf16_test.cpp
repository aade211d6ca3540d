// bf16 rounding and Precision::bf16 products (tensor/bf16.h, tensor/blas.h).
// Rounding: the vectorized conversion against the reference written from the definition, over every upper half
// of a float32 with the lower halves that decide rounding (zero, one, just below/at/above the tie, all ones),
// which covers ties to even, NaN (incl. payloads that truncation would turn into inf), inf, overflow and
// denormals; plus values worked out by hand.
// Products: each bf16 product against the double-precision sum of products of the rounded inputs, within
// float32 rounding of that sum (1e-6 of sum |a b|), on the native and the emulated path, for the model's
// shapes, transposed and strided operands, alpha, beta and the bias epilogue; and the same tolerance is
// broken by the float32 product of unrounded inputs, so the check sees the rounding.
// Kept-in-bf16 inputs (gemm_a16, a linear layer's bf16 input, GELU written as bf16): the same bits as rounding
// them inside the product.
#include "tensor/bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/layers.h"
#include "nn/tensor_parallel_layers.h"
#include "tensor/blas.h"
#include "tensor/fma_peak.h"
#include "tests/unit/gradcheck.h"

namespace {

float bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16Round, VectorizedMatchesReferenceOverEveryUpperHalf) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xc000, 0xfffe, 0xffff};
  std::vector<float> src;
  for (uint32_t hi = 0; hi < 0x10000; hi++)
    for (uint32_t lo : lows) src.push_back(bits(hi << 16 | lo));
  std::vector<uint16_t> out(src.size());
  mt::to_bf16(src.data(), out.data(), src.size());
  std::vector<float> rounded(src.size());
  mt::round_to_bf16(src.data(), rounded.data(), src.size());
  for (size_t i = 0; i < src.size(); i++) {
    const uint16_t want = mt::bf16_from_f32_reference(src[i]);
    ASSERT_EQ(out[i], want) << std::hex << "input 0x" << std::bit_cast<uint32_t>(src[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), (uint32_t)want << 16) << i;
    ASSERT_EQ(std::isnan(src[i]), std::isnan(mt::f32_from_bf16(out[i]))) << i;
  }
}

TEST(Bf16Round, HandWorkedValues) {
  using mt::bf16_from_f32;
  EXPECT_EQ(bf16_from_f32(1.0f), 0x3f80);
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);             // tie between 1 and 1+2^-7: the even (1)
  EXPECT_EQ(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie between 1+2^-7 (odd) and 1+2^-6: up
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);  // just above the tie
  EXPECT_EQ(bf16_from_f32(-1.0f - 0x1p-8f - 0x1p-23f), 0xbf81);
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_f32(bits(0x00000001)), 0x0000);                   // smallest denormal: down to zero
  EXPECT_EQ(bf16_from_f32(bits(0x00008000)), 0x0000);                   // denormal tie: to the even (0)
  EXPECT_EQ(bf16_from_f32(bits(0x00018000)), 0x0002);                   // denormal tie from 1: up to the even (2)
  EXPECT_EQ(bf16_from_f32(bits(0x00010001)), 0x0001);                   // denormals are kept, not flushed
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::max()), 0x7f80);  // above max bf16 + half ulp: inf
  EXPECT_EQ(bf16_from_f32(bits(0x7f7f7fff)), 0x7f7f);                   // just below that tie: the largest finite bf16
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16_from_f32(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(bf16_from_f32(bits(0x7f800001)), 0x7fc0);  // a NaN whose payload is all in the lower half
  EXPECT_EQ(bf16_from_f32(bits(0xffc12345)), 0xffc1);
}

// A product to check: op(A)[M,K] op(B)[K,N] with A, B stored with extra columns (ld > stored width) when
// strided, C with row stride ldc >= N.
struct Case {
  bool ta, tb;
  int M, N, K;
  bool strided;
  float alpha, beta;
};

struct Operands {
  int lda, ldb, ldc;
  std::vector<float> A, B, C0;
};

Operands make(const Case& c, uint64_t seed) {
  Operands o;
  const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K, br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
  const int pad = c.strided ? 5 : 0;
  o.lda = ac + pad;
  o.ldb = bc + pad;
  o.ldc = c.N + pad;
  o.A = mt::testing::randn((size_t)ar * o.lda, seed, "A");
  o.B = mt::testing::randn((size_t)br * o.ldb, seed, "B", 0.02f);
  o.C0 = mt::testing::randn((size_t)c.M * o.ldc, seed, "C");
  return o;
}

// Checks gemm(..., Precision::bf16) on the current path; returns how many elements the float32 product of the
// unrounded inputs puts outside the tolerance (the rounding the check can see).
int check_product(const Case& c, uint64_t seed) {
  Operands o = make(c, seed);
  std::vector<float> C = o.C0, C32 = o.C0;
  mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C.data(), o.ldc,
           mt::Precision::bf16);
  mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C32.data(), o.ldc);
  int visible = 0;
  for (int i = 0; i < c.M; i++)
    for (int j = 0; j < c.N; j++) {
      double s = 0, abs = 0;
      for (int k = 0; k < c.K; k++) {
        const float a = c.ta ? o.A[(size_t)k * o.lda + i] : o.A[(size_t)i * o.lda + k];
        const float b = c.tb ? o.B[(size_t)j * o.ldb + k] : o.B[(size_t)k * o.ldb + j];
        const double p = (double)mt::bf16_round(a) * mt::bf16_round(b);  // exact in float32 too
        s += p;
        abs += std::fabs(p);
      }
      const size_t at = (size_t)i * o.ldc + j;
      const double want = c.alpha * s + c.beta * o.C0[at];
      const double tol = 1e-6 * (std::fabs(c.alpha) * abs + std::fabs(c.beta * o.C0[at])) + 1e-30;
      EXPECT_NEAR(C[at], want, tol) << "element " << i << "," << j;
      if (std::fabs(C32[at] - want) > tol) visible++;
    }
  // Padding columns of C are not written.
  for (int i = 0; i < c.M; i++)
    for (int j = c.N; j < o.ldc; j++) EXPECT_EQ(C[(size_t)i * o.ldc + j], o.C0[(size_t)i * o.ldc + j]);
  return visible;
}

// The products of a small GPT (N = 64 rows, C = 48, hs = 16, V = 65) and of GPT-2's width (C = 768), as
// linear forward/backward and attention issue them, every transpose pair, contiguous and strided.
std::vector<Case> model_cases() {
  std::vector<Case> cases;
  const int shapes[][3] = {{64, 144, 48}, {64, 48, 192}, {48, 192, 64}, {64, 65, 48},
                           {16, 64, 16},  {64, 16, 64},  {32, 96, 768}, {7, 3, 1}};
  for (auto& s : shapes)
    for (int t = 0; t < 4; t++)
      for (int strided = 0; strided < 2; strided++)
        cases.push_back(
            {bool(t & 1), bool(t & 2), s[0], s[1], s[2], bool(strided), t == 3 ? 0.25f : 1.0f, strided ? 1.0f : 0.0f});
  return cases;
}

class Bf16Gemm : public ::testing::TestWithParam<int> {  // 0: emulated, 1: native
 protected:
  void SetUp() override {
    mt::set_bf16_emulation(GetParam() == 0);
    if (GetParam() == 1 && !mt::bf16_native()) GTEST_SKIP() << "no bf16 instructions here: " << mt::gemm_kernel_line();
  }
  void TearDown() override {
    mt::set_bf16_emulation(std::nullopt);
    mt::set_num_threads(1);
  }
};

TEST_P(Bf16Gemm, ProductsOfRoundedInputsForModelShapes) {
  EXPECT_EQ(mt::bf16_kernel_name() == "emulated", GetParam() == 0);
  for (int threads : {1, 2}) {
    mt::set_num_threads(threads);
    uint64_t seed = 1;
    for (const Case& c : model_cases()) {
      SCOPED_TRACE(::testing::Message() << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K "
                                        << c.K << " strided " << c.strided << " threads " << threads);
      const int visible = check_product(c, seed++);
      if (c.K >= 16) {
        EXPECT_GT(visible, c.M * c.N / 2) << "the float32 product passes the bf16 check";
      }
    }
  }
  std::printf("kernels: %s\n", mt::gemm_kernel_line().c_str());
}

// Called from inside a parallel region (attention's per-head products): each thread packs its own copies.
TEST_P(Bf16Gemm, InsideParallelRegion) {
  mt::set_num_threads(2);
  const Case c{false, true, 64, 64, 16, true, 0.25f, 0.0f};
  int bad = 0;
#pragma omp parallel for num_threads(2) reduction(+ : bad)
  for (int r = 0; r < 8; r++) {
    Operands o = make(c, 100 + r);
    std::vector<float> C = o.C0, Cr = o.C0;
    std::vector<float> Ar(o.A.size()), Br(o.B.size());
    mt::round_to_bf16(o.A.data(), Ar.data(), Ar.size());
    mt::round_to_bf16(o.B.data(), Br.data(), Br.size());
    mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f, C.data(), o.ldc,
             mt::Precision::bf16);
    mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, Ar.data(), o.lda, Br.data(), o.ldb, 0.0f, Cr.data(), o.ldc);
    for (int i = 0; i < c.M; i++)
      for (int j = 0; j < c.N; j++) {
        const float x = C[(size_t)i * o.ldc + j], y = Cr[(size_t)i * o.ldc + j];
        bad += std::fabs(x - y) > 1e-5f * (1.0f + std::fabs(y));
      }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(Bf16Gemm, BiasEpilogue) {
  const int M = 64, N = 192, K = 48;
  auto A = mt::testing::randn(M * K, 7, "A"), B = mt::testing::randn(K * N, 7, "B", 0.02f);
  auto bias = mt::testing::randn(N, 7, "bias"), C0 = mt::testing::randn(M * N, 7, "C");
  for (int acc = 0; acc < 2; acc++) {
    auto C = C0;
    mt::gemm_bias(M, N, K, A.data(), B.data(), bias.data(), C.data(), acc, mt::Precision::bf16);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0, abs = 0;
        for (int k = 0; k < K; k++) {
          const double p = (double)mt::bf16_round(A[i * K + k]) * mt::bf16_round(B[k * N + j]);
          s += p;
          abs += std::fabs(p);
        }
        const double want = s + bias[j] + (acc ? C0[i * N + j] : 0.0);
        const double tol = 1e-6 * (abs + std::fabs(bias[j]) + (acc ? std::fabs(C0[i * N + j]) : 0.0));
        ASSERT_NEAR(C[i * N + j], want, tol) << acc << " " << i << "," << j;
      }
  }
}

// A kept in bf16 (gemm_a16, gemm_bias_a16) gives the bits gemm(..., bf16) gives for the float32 A it was rounded
// from: a saved bf16 activation changes no result.
TEST_P(Bf16Gemm, PreRoundedAIsTheSameProductBitForBit) {
  for (int threads : {1, 2}) {
    mt::set_num_threads(threads);
    uint64_t seed = 50;
    for (const Case& c : model_cases()) {
      SCOPED_TRACE(::testing::Message() << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K "
                                        << c.K << " strided " << c.strided << " threads " << threads);
      Operands o = make(c, seed++);
      std::vector<uint16_t> A16(o.A.size());
      mt::to_bf16(o.A.data(), A16.data(), A16.size());
      std::vector<float> C = o.C0, C16 = o.C0;
      mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C.data(), o.ldc,
               mt::Precision::bf16);
      mt::gemm_a16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A16.data(), o.lda, o.B.data(), o.ldb, c.beta, C16.data(), o.ldc);
      ASSERT_EQ(0, std::memcmp(C.data(), C16.data(), sizeof(float) * C.size()));
    }
  }
  const int M = 64, N = 192, K = 48;
  auto A = mt::testing::randn(M * K, 9, "A"), B = mt::testing::randn(K * N, 9, "B", 0.02f);
  auto bias = mt::testing::randn(N, 9, "bias"), C0 = mt::testing::randn(M * N, 9, "C");
  std::vector<uint16_t> A16(A.size());
  mt::to_bf16(A.data(), A16.data(), A.size());
  for (int acc = 0; acc < 2; acc++) {
    auto C = C0, C16 = C0;
    mt::gemm_bias(M, N, K, A.data(), B.data(), bias.data(), C.data(), acc, mt::Precision::bf16);
    mt::gemm_bias_a16(M, N, K, A16.data(), B.data(), bias.data(), C16.data(), acc);
    ASSERT_EQ(0, std::memcmp(C.data(), C16.data(), sizeof(float) * C.size())) << "accumulate " << acc;
  }
}

// GELU written straight to bf16 (an fcproj input kept for backward) is the bf16 of the float32 GELU, bit for bit,
// in and out of a parallel loop.
TEST(Bf16Activations, GeluToBf16IsRoundedGelu) {
  const size_t n = 10007;
  auto x = mt::testing::randn(n, 11, "x", 4.0f);
  std::vector<float> g(n);
  std::vector<uint16_t> want(n), got(n, 0xffff);
  for (int threads : {1, 2}) {
    mt::set_num_threads(threads);
    mt::nn::gelu_forward(g.data(), x.data(), n);
    mt::to_bf16(g.data(), want.data(), n);
    mt::nn::gelu_forward_bf16(got.data(), x.data(), n);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(uint16_t))) << threads << " threads";
  }
  mt::set_num_threads(1);
}

// A linear layer whose input is kept in bf16 gives the bf16 layer's output and gradients bit for bit.
TEST_P(Bf16Gemm, LinearWithBf16InputIsTheBf16Layer) {
  const int N = 64, C = 192, OC = 48;
  auto x = mt::testing::randn(N * C, 13, "x"), W = mt::testing::randn(C * OC, 13, "W", 0.02f);
  auto b = mt::testing::randn(OC, 13, "b"), r = mt::testing::randn(N * OC, 13, "r"),
       dy = mt::testing::randn(N * OC, 13, "dy");
  std::vector<uint16_t> x16(x.size());
  mt::to_bf16(x.data(), x16.data(), x.size());
  for (int with_bias = 0; with_bias < 2; with_bias++)
    for (int with_res = 0; with_res < 2; with_res++) {
      std::vector<float> y(N * OC), y16(N * OC);
      const float* bb = with_bias ? b.data() : nullptr;
      const float* rr = with_res ? r.data() : nullptr;
      mt::nn::linear_forward(y.data(), x.data(), W.data(), bb, N, C, OC, rr, mt::Precision::bf16);
      mt::nn::linear_forward(y16.data(), x16.data(), W.data(), bb, N, C, OC, rr);
      ASSERT_EQ(0, std::memcmp(y.data(), y16.data(), y.size() * sizeof(float))) << with_bias << with_res;
    }
  std::vector<float> dx(N * C), dx16(N * C), dW(C * OC), dW16(C * OC), db(OC), db16(OC);
  mt::nn::linear_backward(dx.data(), mt::nn::GradOut(dW.data()), mt::nn::GradOut(db.data()), dy.data(), x.data(),
                          W.data(), N, C, OC, false, mt::Precision::bf16);
  mt::nn::linear_backward(dx16.data(), mt::nn::GradOut(dW16.data()), mt::nn::GradOut(db16.data()), dy.data(),
                          x16.data(), W.data(), N, C, OC, false);
  EXPECT_EQ(0, std::memcmp(dx.data(), dx16.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dW.data(), dW16.data(), dW.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(db.data(), db16.data(), db.size() * sizeof(float)));
}

// A weight read from its bf16 mirror (nn::Weight with b16: the store's copy rounded once per step) gives the bf16
// layer's output and gradients bit for bit, with the input float32 or kept in bf16, with and without bias and
// residual; and so does gemm_bias_16, the mirror's bias form. The float32 weight passed beside the mirror is
// poisoned (NaN), so a product that read it instead of the mirror would show.
TEST_P(Bf16Gemm, LinearReadingTheWeightMirrorIsTheBf16Layer) {
  const int N = 64, C = 192, OC = 48;
  auto x = mt::testing::randn(N * C, 19, "x"), W = mt::testing::randn(C * OC, 19, "W", 0.02f);
  auto b = mt::testing::randn(OC, 19, "b"), r = mt::testing::randn(N * OC, 19, "r"),
       dy = mt::testing::randn(N * OC, 19, "dy");
  std::vector<uint16_t> x16(x.size()), W16(W.size());
  mt::to_bf16(x.data(), x16.data(), x.size());
  mt::to_bf16(W.data(), W16.data(), W.size());
  const std::vector<float> poison(W.size(), std::numeric_limits<float>::quiet_NaN());
  const mt::nn::Weight mirror(poison.data(), W16.data());
  for (int with_bias = 0; with_bias < 2; with_bias++)
    for (int with_res = 0; with_res < 2; with_res++) {
      std::vector<float> y(N * OC), ym(N * OC), ym16(N * OC);
      const float* bb = with_bias ? b.data() : nullptr;
      const float* rr = with_res ? r.data() : nullptr;
      mt::nn::linear_forward(y.data(), x.data(), W.data(), bb, N, C, OC, rr, mt::Precision::bf16);
      mt::nn::linear_forward(ym.data(), x.data(), mirror, bb, N, C, OC, rr, mt::Precision::bf16);
      mt::nn::linear_forward(ym16.data(), x16.data(), mirror, bb, N, C, OC, rr);
      ASSERT_EQ(0, std::memcmp(y.data(), ym.data(), y.size() * sizeof(float))) << with_bias << with_res;
      ASSERT_EQ(0, std::memcmp(y.data(), ym16.data(), y.size() * sizeof(float))) << with_bias << with_res;
    }
  for (int kept = 0; kept < 2; kept++) {
    std::vector<float> dx(N * C), dxm(N * C), dW(C * OC), dWm(C * OC), db(OC), dbm(OC);
    mt::nn::linear_backward(dx.data(), mt::nn::GradOut(dW.data()), mt::nn::GradOut(db.data()), dy.data(), x.data(),
                            W.data(), N, C, OC, false, mt::Precision::bf16);
    if (kept)
      mt::nn::linear_backward(dxm.data(), mt::nn::GradOut(dWm.data()), mt::nn::GradOut(dbm.data()), dy.data(),
                              x16.data(), mirror, N, C, OC, false);
    else
      mt::nn::linear_backward(dxm.data(), mt::nn::GradOut(dWm.data()), mt::nn::GradOut(dbm.data()), dy.data(),
                              x.data(), mirror, N, C, OC, false, mt::Precision::bf16);
    EXPECT_EQ(0, std::memcmp(dx.data(), dxm.data(), dx.size() * sizeof(float))) << kept;
    EXPECT_EQ(0, std::memcmp(dW.data(), dWm.data(), dW.size() * sizeof(float))) << kept;
    EXPECT_EQ(0, std::memcmp(db.data(), dbm.data(), db.size() * sizeof(float))) << kept;
  }
  auto C0 = mt::testing::randn(N * OC, 19, "C");
  for (int acc = 0; acc < 2; acc++) {
    auto Cw = C0, C16 = C0;
    mt::gemm_bias(N, OC, C, x.data(), W.data(), b.data(), Cw.data(), acc, mt::Precision::bf16);
    mt::gemm_bias_16(N, OC, C, x16.data(), W16.data(), b.data(), C16.data(), acc);
    ASSERT_EQ(0, std::memcmp(Cw.data(), C16.data(), sizeof(float) * Cw.size())) << "accumulate " << acc;
  }
}

// The tied logits reading wte's mirror (forward and the input gradient), and their backward with x kept in bf16,
// give the bf16 products' bits.
TEST_P(Bf16Gemm, TiedLogitsReadingTheMirrorAreTheBf16Products) {
  const int N = 64, C = 48, V = 65;
  auto x = mt::testing::randn(N * C, 23, "x"), wte = mt::testing::randn(V * C, 23, "wte", 0.02f);
  auto dl = mt::testing::randn(N * V, 23, "dlogits");
  std::vector<uint16_t> w16(wte.size());
  mt::to_bf16(wte.data(), w16.data(), wte.size());
  const std::vector<float> poison(wte.size(), std::numeric_limits<float>::quiet_NaN());
  const mt::nn::TpRows rows(nullptr, false);
  std::vector<float> lg(N * V), lgm(N * V);
  mt::nn::vocab_parallel_logits_forward(rows, nullptr, lg.data(), x.data(), wte.data(), N, C, V, mt::Precision::bf16);
  mt::nn::vocab_parallel_logits_forward(rows, nullptr, lgm.data(), x.data(), {poison.data(), w16.data()}, N, C, V,
                                        mt::Precision::bf16);
  EXPECT_EQ(0, std::memcmp(lg.data(), lgm.data(), lg.size() * sizeof(float)));
  std::vector<float> dx(N * C), dxm(N * C), dw(V * C), dwm(V * C);
  mt::nn::vocab_parallel_logits_backward(rows, nullptr, nullptr, dx.data(), mt::nn::GradOut(dw.data(), true), dl.data(),
                                         x.data(), wte.data(), N, C, V, mt::Precision::bf16);
  mt::nn::vocab_parallel_logits_backward(rows, nullptr, nullptr, dxm.data(), mt::nn::GradOut(dwm.data(), true),
                                         dl.data(), x.data(), {poison.data(), w16.data()}, N, C, V, mt::Precision::bf16);
  EXPECT_EQ(0, std::memcmp(dx.data(), dxm.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw.data(), dwm.data(), dw.size() * sizeof(float)));
  // x (the final LayerNorm's output) kept in bf16 for backward: the same bits again.
  std::vector<uint16_t> x16(x.size());
  mt::to_bf16(x.data(), x16.data(), x.size());
  std::vector<float> dxk(N * C), dwk(V * C);
  mt::nn::vocab_parallel_logits_backward(rows, nullptr, nullptr, dxk.data(), mt::nn::GradOut(dwk.data(), true),
                                         dl.data(), x16.data(), {poison.data(), w16.data()}, N, C, V);
  EXPECT_EQ(0, std::memcmp(dx.data(), dxk.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw.data(), dwk.data(), dw.size() * sizeof(float)));
}

// Both operands kept in bf16 (gemm_16) gives the bits gemm(..., bf16) gives for the float32 operands they were
// rounded from, strided or not: rounding an operand once for several products changes no result.
TEST_P(Bf16Gemm, BothPreRoundedIsTheSameProductBitForBit) {
  for (int threads : {1, 2}) {
    mt::set_num_threads(threads);
    uint64_t seed = 70;
    for (const Case& c : model_cases()) {
      SCOPED_TRACE(::testing::Message() << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K "
                                        << c.K << " strided " << c.strided << " threads " << threads);
      Operands o = make(c, seed++);
      std::vector<uint16_t> A16(o.A.size()), B16(o.B.size());
      mt::to_bf16(o.A.data(), A16.data(), A16.size());
      mt::to_bf16(o.B.data(), B16.data(), B16.size());
      std::vector<float> C = o.C0, C16 = o.C0;
      mt::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C.data(), o.ldc,
               mt::Precision::bf16);
      mt::gemm_16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A16.data(), o.lda, B16.data(), o.ldb, c.beta, C16.data(), o.ldc);
      ASSERT_EQ(0, std::memcmp(C.data(), C16.data(), sizeof(float) * C.size()));
    }
  }
}

// The bf16 linear layer's backward (its output gradient rounded once for both products) equals the two products
// each rounding its own inputs, bit for bit: dX = dY W^T, dW += X^T dY.
TEST_P(Bf16Gemm, LinearBackwardIsItsTwoBf16Products) {
  const int N = 70, C = 48, OC = 144;
  auto x = mt::testing::randn(N * C, 17, "x"), W = mt::testing::randn(C * OC, 17, "W", 0.02f);
  auto dy = mt::testing::randn(N * OC, 17, "dy"), dW0 = mt::testing::randn(C * OC, 17, "dW0");
  std::vector<float> dx(N * C), dW = dW0, want_dx(N * C), want_dW = dW0, db(OC, 0.0f);
  mt::nn::linear_backward(dx.data(), mt::nn::GradOut(dW.data()), mt::nn::GradOut(db.data()), dy.data(), x.data(),
                          W.data(), N, C, OC, false, mt::Precision::bf16);
  mt::gemm(false, true, N, C, OC, 1.0f, dy.data(), OC, W.data(), OC, 0.0f, want_dx.data(), C, mt::Precision::bf16);
  mt::gemm(true, false, C, OC, N, 1.0f, x.data(), C, dy.data(), OC, 1.0f, want_dW.data(), OC, mt::Precision::bf16);
  EXPECT_EQ(0, std::memcmp(dx.data(), want_dx.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dW.data(), want_dW.data(), dW.size() * sizeof(float)));
}

// Attention under bf16 (each head's q, k, v and dy rounded once, every tile's products reading them) equals the
// same tiles with every product rounding its own inputs, bit for bit. T = 80: a full tile of 64 and a partial one.
TEST_P(Bf16Gemm, AttentionIsItsBf16ProductsTileByTile) {
  const int B = 2, T = 80, C = 32, H = 2, hs = C / H, C3 = 3 * C, tile = 64;
  const float scale = 1.0f / std::sqrt((float)hs);
  auto qkv = mt::testing::randn(B * T * C3, 19, "qkv"), dy = mt::testing::randn(B * T * C, 19, "dy");
  std::vector<float> y(B * T * C), att((size_t)B * H * T * T), dqkv(B * T * C3);
  mt::nn::attention_forward(y.data(), att.data(), qkv.data(), B, T, C, H, mt::Precision::bf16);
  mt::nn::attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, H, mt::Precision::bf16);
  {
    // qkv kept in bf16 (the model's way): the same bits as the float32 qkv under bf16.
    std::vector<uint16_t> qkv16(qkv.size());
    mt::to_bf16(qkv.data(), qkv16.data(), qkv.size());
    std::vector<float> y16(y.size()), att16(att.size()), dqkv16(dqkv.size());
    mt::nn::attention_forward(y16.data(), att16.data(), qkv16.data(), B, T, C, H);
    mt::nn::attention_backward(dqkv16.data(), dy.data(), qkv16.data(), att16.data(), B, T, C, H);
    EXPECT_EQ(0, std::memcmp(y.data(), y16.data(), y.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(att.data(), att16.data(), att.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(dqkv.data(), dqkv16.data(), dqkv.size() * sizeof(float)));
  }
  // The reference: the float32 attention's tiles with Precision::bf16 products (softmax and its backward as
  // attention.cpp's comment gives them, on the same float32 values).
  std::vector<float> want_y(y.size()), P((size_t)T * T), dS((size_t)tile * T), want_dqkv(dqkv.size());
  const auto bf = mt::Precision::bf16;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const float *q = qkv.data() + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
      float* yy = want_y.data() + (size_t)b * T * C + h * hs;
      const float* Pgot = att.data() + ((size_t)b * H + h) * T * T;
      for (int r0 = 0; r0 < T; r0 += tile) {
        const int r1 = std::min(T, r0 + tile);
        mt::gemm(false, true, r1 - r0, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f, P.data() + (size_t)r0 * T, T, bf);
        for (int t = r0; t < r1; t++) {
          float* row = P.data() + (size_t)t * T;
          float mx = -INFINITY, sum = 0.0f;
          for (int j = 0; j <= t; j++) mx = std::max(mx, row[j]);
          for (int j = 0; j <= t; j++) sum += std::exp(row[j] - mx);
          for (int j = 0; j < T; j++) ASSERT_NEAR(Pgot[(size_t)t * T + j], j <= t ? std::exp(row[j] - mx) / sum : 0.0f, 1e-6f);
        }
        // From here on the layer's own probabilities: the products are what is checked, not exp's last bit.
        mt::gemm(false, false, r1 - r0, hs, r1, 1.0f, Pgot + (size_t)r0 * T, T, v, C3, 0.0f, yy + (size_t)r0 * C, C, bf);
      }
      float* dq = want_dqkv.data() + (size_t)b * T * C3 + h * hs;
      const float* d = dy.data() + (size_t)b * T * C + h * hs;
      for (int r0 = (T - 1) / tile * tile; r0 >= 0; r0 -= tile) {
        const int r1 = std::min(T, r0 + tile), m = r1 - r0;
        const float beta = r1 == T ? 0.0f : 1.0f;
        mt::gemm(false, true, m, r1, hs, 1.0f, d + (size_t)r0 * C, C, v, C3, 0.0f, dS.data(), T, bf);
        for (int i = 0; i < m; i++) {
          float* row = dS.data() + (size_t)i * T;
          const float* p = Pgot + (size_t)(r0 + i) * T;
          float dot = 0.0f;
          for (int j = 0; j <= r0 + i; j++) dot += p[j] * row[j];
          for (int j = 0; j < r1; j++) row[j] = j <= r0 + i ? p[j] * (row[j] - dot) * scale : 0.0f;
        }
        mt::gemm(false, false, m, hs, r1, 1.0f, dS.data(), T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3, bf);
        mt::gemm(true, false, r1, hs, m, 1.0f, dS.data(), T, q + (size_t)r0 * C3, C3, beta, dq + C, C3, bf);
        mt::gemm(true, false, r1, hs, m, 1.0f, Pgot + (size_t)r0 * T, T, d + (size_t)r0 * C, C, beta, dq + 2 * C, C3, bf);
      }
    }
  EXPECT_EQ(0, std::memcmp(y.data(), want_y.data(), y.size() * sizeof(float)));
  // The softmax backward's dot product is summed in another order here, so dS may differ in its last float32
  // bit, and an element that sits at a bf16 rounding boundary can round the other way (odds about 1e-7 / 2^-8
  // per element): nearly every gradient is equal to float32 rounding and none is far off. A wrong operand or a
  // stale copy moves most of them.
  size_t off = 0;
  for (size_t i = 0; i < dqkv.size(); i++) {
    const float tol = 1e-5f * (1.0f + std::fabs(want_dqkv[i]));
    off += std::fabs(dqkv[i] - want_dqkv[i]) > tol;
    ASSERT_NEAR(dqkv[i], want_dqkv[i], 100 * tol) << i;
  }
  EXPECT_LE(off, dqkv.size() / 100);
}

INSTANTIATE_TEST_SUITE_P(Path, Bf16Gemm, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& p) { return p.param ? "native" : "emulated"; });

// Emulated on contiguous operands is the float32 kernel on the rounded operands: the same bits.
TEST(Bf16Gemm, EmulatedIsFloat32KernelOnRoundedInputsBitForBit) {
  mt::set_bf16_emulation(true);
  const int M = 64, N = 144, K = 48;
  auto A = mt::testing::randn(M * K, 3, "A"), B = mt::testing::randn(K * N, 3, "B");
  std::vector<float> Ar(A.size()), Br(B.size()), C1(M * N), C2(M * N);
  mt::round_to_bf16(A.data(), Ar.data(), A.size());
  mt::round_to_bf16(B.data(), Br.data(), B.size());
  mt::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C1.data(), N, mt::Precision::bf16);
  mt::gemm(false, false, M, N, K, 1.0f, Ar.data(), K, Br.data(), N, 0.0f, C2.data(), N);
  mt::set_bf16_emulation(std::nullopt);
  EXPECT_EQ(0, std::memcmp(C1.data(), C2.data(), sizeof(float) * C1.size()));
}

// Run by ctest with MESHTRAIN_BF16_EMULATE set (tests/unit/extra.cmake): the variable picks the path.
TEST(Bf16Env, EmulateVariableChoosesThePath) {
  const char* v = std::getenv("MESHTRAIN_BF16_EMULATE");
  if (!v) GTEST_SKIP() << "MESHTRAIN_BF16_EMULATE unset";
  const std::string s = v;
  if (s == "1") {
    EXPECT_EQ(mt::bf16_kernel_name(), "emulated");
    EXPECT_NE(mt::gemm_kernel_line().find("bf16: emulated"), std::string::npos) << mt::gemm_kernel_line();
  } else if (s == "0") {
    EXPECT_NE(mt::bf16_kernel_name(), "");
  } else {
    EXPECT_THROW(mt::bf16_kernel_name(), mt::InputError);
  }
}

}  // namespace

// The bf16 dot-product ceiling: vdpbf16ps does twice the FLOP of a float32 FMA per instruction, so where the CPU
// has it the measured rate is well above the float32 FMA rate (2x on Zen 4 and Cooper Lake); elsewhere none.
TEST(Bf16Peak, DotProductRateAboveFloat32FmaRate) {
  const mt::FmaPeak f = mt::measure_fma_peak(1, 0.2), b = mt::measure_bf16_peak(1, 0.2);
  if (b.isa == "none") {
    EXPECT_EQ(b.gflops, 0.0);
    GTEST_SKIP() << "no avx512_bf16 here";
  }
  EXPECT_EQ(b.isa, "avx512_bf16");
  EXPECT_GT(b.gflops, 1.3 * f.gflops) << "bf16 " << b.gflops << " vs float32 FMA " << f.gflops << " GFLOP/s";
}
