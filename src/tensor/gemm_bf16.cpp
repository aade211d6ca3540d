// The backend-independent half of Precision::bf16 (blas.h): the choice between native and emulated products,
// and the emulated products themselves.
#include "tensor/gemm_bf16.h"

#include <atomic>
#include <utility>

#include "core/env.h"
#include "tensor/bf16.h"
#include "tensor/buffer.h"

namespace mt {

namespace {

// set_bf16_emulation's value: -1 none (MESHTRAIN_BF16_EMULATE decides), 0 not forced, 1 forced.
std::atomic<int> g_force{-1};

bool emulation_forced() {
  const int f = g_force.load(std::memory_order_relaxed);
  if (f >= 0) return f == 1;
  // Read once: a bad value is an InputError at the first bf16 product or the run's first line, every time.
  static const std::optional<bool> env = env_flag("MESHTRAIN_BF16_EMULATE");
  return env.value_or(false);
}

// This thread's copy buffer, grown to at least n floats.
float* grow(AlignedBuffer& b, size_t n) {
  if (b.size() < n) b.resize(n);
  return b.data();
}

// The rows x cols bf16 matrix at src (row stride ld) widened into dst (contiguous): the values pack_rounded
// would give for the float32 matrix src was rounded from.
void widen(const uint16_t* src, int rows, int cols, int ld, float* dst) {
  for (int r = 0; r < rows; r++) {
    const uint16_t* s = src + (size_t)r * ld;
    float* d = dst + (size_t)r * cols;
#pragma omp simd
    for (int c = 0; c < cols; c++) d[c] = f32_from_bf16(s[c]);
  }
}

}  // namespace

bool bf16_native() { return !emulation_forced() && detail::bf16_isa_native(); }

std::string bf16_kernel_name() { return bf16_native() ? detail::bf16_isa_name() : "emulated"; }

void set_bf16_emulation(std::optional<bool> force) { g_force = force ? (*force ? 1 : 0) : -1; }

namespace detail {

namespace {

// This thread's float32 copies of an emulated product's operands: A as fill_a writes it (rounded, or widened
// from bf16), B rounded to bf16; both packed contiguous (A stored [ar, ac], B [br, bc]). One pair of buffers per
// thread, grown and never shrunk, shared by the four entry points below.
std::pair<AlignedBuffer, AlignedBuffer>& thread_buffers() {
  thread_local std::pair<AlignedBuffer, AlignedBuffer> ab;
  return ab;
}

template <class FillA>
std::pair<const float*, const float*> operands(int ar, int ac, FillA fill_a, const float* B, int br, int bc, int ldb) {
  auto& [a, b] = thread_buffers();
  float* a32 = grow(a, (size_t)ar * ac);
  float* b16 = grow(b, (size_t)br * bc);
  fill_a(a32);
  pack_rounded(B, br, bc, ldb, b16);
  return {a32, b16};
}

}  // namespace

// Stored shapes: A is [M,K], or [K,M] when transposed; B is [K,N], or [N,K].
void gemm_bf16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc) {
  const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
  auto [a32, b16] = operands(
      ar, ac, [&](float* d) { pack_rounded(A, ar, ac, lda, d); }, B, br, bc, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a32, ac, b16, bc, beta, C, ldc, Precision::fp32);
}

void gemm_bias_bf16_emulated(int M, int N, int K, const float* A, const float* B, const float* bias, float* C,
                             bool accumulate) {
  auto [a32, b16] = operands(
      M, K, [&](float* d) { pack_rounded(A, M, K, K, d); }, B, K, N, N);
  gemm_bias(M, N, K, a32, b16, bias, C, accumulate, Precision::fp32);
}

void gemm_a16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
  const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
  auto [a32, b16] = operands(
      ar, ac, [&](float* d) { widen(A16, ar, ac, lda, d); }, B, br, bc, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a32, ac, b16, bc, beta, C, ldc, Precision::fp32);
}

void gemm_16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                      const uint16_t* B16, int ldb, float beta, float* C, int ldc) {
  const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
  auto& [a, b] = thread_buffers();
  float* a32 = grow(a, (size_t)ar * ac);
  float* b32 = grow(b, (size_t)br * bc);
  widen(A16, ar, ac, lda, a32);
  widen(B16, br, bc, ldb, b32);
  gemm(trans_a, trans_b, M, N, K, alpha, a32, ac, b32, bc, beta, C, ldc, Precision::fp32);
}

void gemm_bias_a16_emulated(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                            bool accumulate) {
  auto [a32, b16] = operands(
      M, K, [&](float* d) { widen(A16, M, K, K, d); }, B, K, N, N);
  gemm_bias(M, N, K, a32, b16, bias, C, accumulate, Precision::fp32);
}

}  // namespace detail

}  // namespace mt
