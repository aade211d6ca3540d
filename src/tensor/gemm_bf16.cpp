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

// This thread's float32 copies of an emulated product's operands, both packed contiguous: a float32 operand
// rounded to bf16, a bf16 one widened (exact). One pair of buffers per thread, grown and never shrunk, shared by
// every entry point below.
std::pair<AlignedBuffer, AlignedBuffer>& thread_buffers() {
  thread_local std::pair<AlignedBuffer, AlignedBuffer> ab;
  return ab;
}

void copy_rounded(const float* src, int rows, int cols, int ld, float* dst) { pack_rounded(src, rows, cols, ld, dst); }
void copy_rounded(const uint16_t* src, int rows, int cols, int ld, float* dst) { widen(src, rows, cols, ld, dst); }

// A stored [ar, ac] and B stored [br, bc] (row strides lda, ldb) as their float32 copies.
template <class TA, class TB>
std::pair<const float*, const float*> operands(const TA* A, int ar, int ac, int lda, const TB* B, int br, int bc,
                                               int ldb) {
  auto& [a, b] = thread_buffers();
  float* a32 = grow(a, (size_t)ar * ac);
  float* b32 = grow(b, (size_t)br * bc);
  copy_rounded(A, ar, ac, lda, a32);
  copy_rounded(B, br, bc, ldb, b32);
  return {a32, b32};
}

// Stored shapes: A is [M,K], or [K,M] when transposed; B is [K,N], or [N,K].
template <class TA, class TB>
void emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const TA* A, int lda, const TB* B, int ldb,
              float beta, float* C, int ldc) {
  const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
  auto [a32, b32] = operands(A, ar, ac, lda, B, br, bc, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a32, ac, b32, bc, beta, C, ldc, Precision::fp32);
}

template <class TA, class TB>
void emulated_bias(int M, int N, int K, const TA* A, const TB* B, const float* bias, float* C, bool accumulate) {
  auto [a32, b32] = operands(A, M, K, K, B, K, N, N);
  gemm_bias(M, N, K, a32, b32, bias, C, accumulate, Precision::fp32);
}

}  // namespace

void gemm_bf16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc) {
  emulated(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bias_bf16_emulated(int M, int N, int K, const float* A, const float* B, const float* bias, float* C,
                             bool accumulate) {
  emulated_bias(M, N, K, A, B, bias, C, accumulate);
}

void gemm_a16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
  emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B, ldb, beta, C, ldc);
}

void gemm_16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A16, int lda,
                      const uint16_t* B16, int ldb, float beta, float* C, int ldc) {
  emulated(trans_a, trans_b, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc);
}

void gemm_bias_a16_emulated(int M, int N, int K, const uint16_t* A16, const float* B, const float* bias, float* C,
                            bool accumulate) {
  emulated_bias(M, N, K, A16, B, bias, C, accumulate);
}

void gemm_bias_16_emulated(int M, int N, int K, const uint16_t* A16, const uint16_t* B16, const float* bias, float* C,
                           bool accumulate) {
  emulated_bias(M, N, K, A16, B16, bias, C, accumulate);
}

}  // namespace detail

}  // namespace mt
