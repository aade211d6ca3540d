// Causal multi-head self-attention, per (batch, head), through GEMMs on strided views of qkv.
//
// Causality is exploited by tiling the query rows in blocks of kTile: block [r0, r1) only attends to keys
// [0, r1), so its GEMMs are (r1-r0) x r1 instead of T x T. With T = 256 and kTile = 64 this does 10/16 of
// the dense work. Per (b, h), forward:
//   S[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T      softmax over j <= t (entries j > t are zero)
//   y[r0:r1]       = P[r0:r1, 0:r1] v[0:r1]
// backward (dP, dS in a kTile x T scratch per thread; tiles from the last, whose dk, dv products write all T
// rows, to the first, whose products add):
//   dP = dy v^T;  dS = P * (dP - rowsum(P * dP)) * scale
//   dq[r0:r1] = dS k[0:r1];  dk[0:r1] += dS^T q[r0:r1];  dv[0:r1] += P^T dy[r0:r1]
// With several threads the (b, h) pairs are split across threads (GEMMs inside run single-threaded: 64-row
// GEMMs do not scale across cores).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nn/layers.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"
#include "tensor/buffer.h"
#include "tensor/vmath.h"

namespace mt::nn {

namespace {

constexpr int kTile = 64;

// Runs body(bh) for bh in [0, BH), across threads when more than one is configured.
template <typename F>
void for_each_head(int BH, F&& body) {
  int nt = num_threads();
  if (nt <= 1) {
    for (int bh = 0; bh < BH; bh++) body(bh);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int bh = 0; bh < BH; bh++) body(bh);
}

// row[0..n) = softmax(row[0..n)), row[n..T) = 0: query t's probabilities over keys 0..t (n = t + 1). Its own
// function, not inlined into the head loop: there GCC 12 left the exponentials scalar in one of the loop's
// copies ("control flow in loop"), the one that runs on a single thread (4.5 of 11.7 ms of a gpt-bench
// layer's attention forward).
[[gnu::noinline]] void softmax_row(float* __restrict row, int n, int T) {
  const float inv = 1.0f / exp_sum_in_place(row, n, max_of(row, n));
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  std::memset(row + n, 0, sizeof(float) * (T - n));
}

// d[0..n) = p * (d - <p, d>) * scale (the softmax's backward for one query row), d[n..m) = 0.
[[gnu::noinline]] void softmax_backward_row(float* __restrict d, const float* __restrict p, int n, int m, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < n; j++) dot += p[j] * d[j];
#pragma omp simd
  for (int j = 0; j < n; j++) d[j] = p[j] * (d[j] - dot) * scale;
  if (m > n) std::memset(d + n, 0, sizeof(float) * (m - n));
}

float* thread_scratch(size_t count) {
  thread_local AlignedBuffer buf;
  if (buf.size() < count) buf.resize(count);
  return buf.data();
}

// Under Precision::bf16 one head's operands rounded once into this thread's copies, then every tile's
// products read them (gemm_16): q, k and v (T x hs each) and, in backward, dy, instead of a rounding pass per
// product (k and v were rounded for every tile, about 2.5 T rows each at T = 256). The tiles' own P and dS
// are rounded as they are made. Same values, same products: the results equal the per-product rounding's.
struct Head16 {
  uint16_t *q, *k, *v, *dy, *tile;
  int hs;
  Head16(int T, int hs_) : hs(hs_) {
    thread_local std::vector<uint16_t> buf;
    const size_t per = (size_t)T * hs;
    if (buf.size() < 4 * per + (size_t)kTile * T) buf.resize(4 * per + (size_t)kTile * T);
    q = buf.data(), k = q + per, v = k + per, dy = v + per, tile = dy + per;
  }
  // The rows x cols block at src (row stride ld) into dst, contiguous.
  static void pack(const float* src, int rows, int cols, int ld, uint16_t* dst) {
    for (int r = 0; r < rows; r++) to_bf16(src + (size_t)r * ld, dst + (size_t)r * cols, cols);
  }
  void load_qkv(const float* q32, int T, int C3) {
    pack(q32, T, hs, C3, q);
    pack(q32 + C3 / 3, T, hs, C3, k);
    pack(q32 + 2 * (C3 / 3), T, hs, C3, v);
  }
};

void forward_head16(const float* q32, float* P, float* y, int T, int C, int hs, float scale) {
  Head16 h(T, hs);
  h.load_qkv(q32, T, 3 * C);
  for (int r0 = 0; r0 < T; r0 += kTile) {
    const int r1 = std::min(T, r0 + kTile), m = r1 - r0;
    gemm_16(false, true, m, r1, hs, scale, h.q + (size_t)r0 * hs, hs, h.k, hs, 0.0f, P + (size_t)r0 * T, T);
    for (int t = r0; t < r1; t++) softmax_row(P + (size_t)t * T, t + 1, T);
    Head16::pack(P + (size_t)r0 * T, m, r1, T, h.tile);
    gemm_16(false, false, m, hs, r1, 1.0f, h.tile, r1, h.v, hs, 0.0f, y + (size_t)r0 * C, C);
  }
}

void backward_head16(const float* q32, const float* P, const float* dy32, float* dq, float* dk, float* dv, int T,
                     int C, int hs, float scale) {
  const int C3 = 3 * C;
  Head16 h(T, hs);
  h.load_qkv(q32, T, C3);
  Head16::pack(dy32, T, hs, C, h.dy);
  float* dS = thread_scratch((size_t)kTile * T);
  for (int r0 = (T - 1) / kTile * kTile; r0 >= 0; r0 -= kTile) {
    const int r1 = std::min(T, r0 + kTile), m = r1 - r0;
    const float beta = r1 == T ? 0.0f : 1.0f;
    gemm_16(false, true, m, r1, hs, 1.0f, h.dy + (size_t)r0 * hs, hs, h.v, hs, 0.0f, dS, T);
    for (int i = 0; i < m; i++)
      softmax_backward_row(dS + (size_t)i * T, P + (size_t)(r0 + i) * T, r0 + i + 1, r1, scale);
    Head16::pack(dS, m, r1, T, h.tile);
    gemm_16(false, false, m, hs, r1, 1.0f, h.tile, r1, h.k, hs, 0.0f, dq + (size_t)r0 * C3, C3);
    gemm_16(true, false, r1, hs, m, 1.0f, h.tile, r1, h.q + (size_t)r0 * hs, hs, beta, dk, C3);
    Head16::pack(P + (size_t)r0 * T, m, r1, T, h.tile);
    gemm_16(true, false, r1, hs, m, 1.0f, h.tile, r1, h.dy + (size_t)r0 * hs, hs, beta, dv, C3);
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H, Precision prec) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for_each_head(B * H, [&](int bh) {
    int b = bh / H, h = bh % H;
    const float* q = qkv + (size_t)b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* P = att + (size_t)bh * T * T;
    float* y = out + (size_t)b * T * C + h * hs;
    if (prec == Precision::bf16) return forward_head16(q, P, y, T, C, hs, scale);
    for (int r0 = 0; r0 < T; r0 += kTile) {
      int r1 = std::min(T, r0 + kTile);
      gemm(false, true, r1 - r0, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f, P + (size_t)r0 * T, T, prec);
      for (int t = r0; t < r1; t++) softmax_row(P + (size_t)t * T, t + 1, T);
      gemm(false, false, r1 - r0, hs, r1, 1.0f, P + (size_t)r0 * T, T, v, C3, 0.0f, y + (size_t)r0 * C, C, prec);
    }
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H,
                        Precision prec) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for_each_head(B * H, [&](int bh) {
    int b = bh / H, h = bh % H;
    const float* q = qkv + (size_t)b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + (size_t)b * T * C3 + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* P = att + (size_t)bh * T * T;
    const float* dy = dout + (size_t)b * T * C + h * hs;
    if (prec == Precision::bf16) return backward_head16(q, P, dy, dq, dk, dv, T, C, hs, scale);
    float* dS = thread_scratch((size_t)kTile * T);
    // dk and dv add up over the tiles. The last tile's keys are all T rows, so tiles run last to first: the
    // first one computed writes dk and dv whole (beta 0), the others add, and nothing has to be zeroed first.
    for (int r0 = (T - 1) / kTile * kTile; r0 >= 0; r0 -= kTile) {
      const int r1 = std::min(T, r0 + kTile), m = r1 - r0;
      const float beta = r1 == T ? 0.0f : 1.0f;
      gemm(false, true, m, r1, hs, 1.0f, dy + (size_t)r0 * C, C, v, C3, 0.0f, dS, T, prec);
      for (int i = 0; i < m; i++)
        softmax_backward_row(dS + (size_t)i * T, P + (size_t)(r0 + i) * T, r0 + i + 1, r1, scale);
      gemm(false, false, m, hs, r1, 1.0f, dS, T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3, prec);
      gemm(true, false, r1, hs, m, 1.0f, dS, T, q + (size_t)r0 * C3, C3, beta, dk, C3, prec);
      gemm(true, false, r1, hs, m, 1.0f, P + (size_t)r0 * T, T, dy + (size_t)r0 * C, C, beta, dv, C3, prec);
    }
  });
}

}  // namespace mt::nn
