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

// Under Precision::bf16 a head's q, k, v are read as bf16 by every tile's products (gemm_16): from the model's
// qkv kept in bf16 (qkv16, row stride 3C), or rounded once from a float32 qkv into this thread's copies (row
// stride hs); in backward dy is rounded once too. Before, every product rounded its own inputs: k and v once per
// tile, about 2.5 T rows each at T = 256. The tiles' P and dS are rounded as they are made. Same values, same
// products: the results equal the per-product rounding's (bf16_test.cpp).
struct HeadOperands {
  const uint16_t *q, *k, *v;
  int ld;  // row stride of q, k, v
};

// This thread's bf16 copies: q, k, v, dy (T x hs each) and one tile (kTile x T).
uint16_t* head_copies(int T, int hs) {
  thread_local std::vector<uint16_t> buf;
  const size_t need = 4 * (size_t)T * hs + (size_t)kTile * T;
  if (buf.size() < need) buf.resize(need);
  return buf.data();
}

// The rows x cols block at src (row stride ld) into dst, contiguous.
void pack_block(const float* src, int rows, int cols, int ld, uint16_t* dst) {
  for (int r = 0; r < rows; r++) to_bf16(src + (size_t)r * ld, dst + (size_t)r * cols, cols);
}

HeadOperands round_head(const float* q32, int T, int C, int hs) {
  uint16_t* q = head_copies(T, hs);
  const size_t per = (size_t)T * hs;
  for (int i = 0; i < 3; i++) pack_block(q32 + i * C, T, hs, 3 * C, q + i * per);
  return {q, q + per, q + 2 * per, hs};
}

void forward_head16(const HeadOperands& h, float* P, float* y, int T, int C, int hs, float scale) {
  uint16_t* tile = head_copies(T, hs) + 4 * (size_t)T * hs;
  for (int r0 = 0; r0 < T; r0 += kTile) {
    const int r1 = std::min(T, r0 + kTile), m = r1 - r0;
    gemm_16(false, true, m, r1, hs, scale, h.q + (size_t)r0 * h.ld, h.ld, h.k, h.ld, 0.0f, P + (size_t)r0 * T, T);
    for (int t = r0; t < r1; t++) softmax_row(P + (size_t)t * T, t + 1, T);
    pack_block(P + (size_t)r0 * T, m, r1, T, tile);
    gemm_16(false, false, m, hs, r1, 1.0f, tile, r1, h.v, h.ld, 0.0f, y + (size_t)r0 * C, C);
  }
}

void backward_head16(const HeadOperands& h, const float* P, const float* dy32, float* dq, float* dk, float* dv, int T,
                     int C, int hs, float scale) {
  const int C3 = 3 * C;
  uint16_t* dy = head_copies(T, hs) + 3 * (size_t)T * hs;
  uint16_t* tile = dy + (size_t)T * hs;
  pack_block(dy32, T, hs, C, dy);
  float* dS = thread_scratch((size_t)kTile * T);
  for (int r0 = (T - 1) / kTile * kTile; r0 >= 0; r0 -= kTile) {
    const int r1 = std::min(T, r0 + kTile), m = r1 - r0;
    const float beta = r1 == T ? 0.0f : 1.0f;
    gemm_16(false, true, m, r1, hs, 1.0f, dy + (size_t)r0 * hs, hs, h.v, h.ld, 0.0f, dS, T);
    for (int i = 0; i < m; i++)
      softmax_backward_row(dS + (size_t)i * T, P + (size_t)(r0 + i) * T, r0 + i + 1, r1, scale);
    pack_block(dS, m, r1, T, tile);
    gemm_16(false, false, m, hs, r1, 1.0f, tile, r1, h.k, h.ld, 0.0f, dq + (size_t)r0 * C3, C3);
    gemm_16(true, false, r1, hs, m, 1.0f, tile, r1, h.q + (size_t)r0 * h.ld, h.ld, beta, dk, C3);
    pack_block(P + (size_t)r0 * T, m, r1, T, tile);
    gemm_16(true, false, r1, hs, m, 1.0f, tile, r1, dy + (size_t)r0 * hs, hs, beta, dv, C3);
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
    if (prec == Precision::bf16) return forward_head16(round_head(q, T, C, hs), P, y, T, C, hs, scale);
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
    if (prec == Precision::bf16) return backward_head16(round_head(q, T, C, hs), P, dy, dq, dk, dv, T, C, hs, scale);
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

// qkv kept in bf16: the heads' operands are views into it (no rounding, no copies).
void attention_forward(float* out, float* att, const uint16_t* qkv16, int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for_each_head(B * H, [&](int bh) {
    const int b = bh / H, h = bh % H;
    const uint16_t* q = qkv16 + (size_t)b * T * C3 + h * hs;
    forward_head16({q, q + C, q + 2 * C, C3}, att + (size_t)bh * T * T, out + (size_t)b * T * C + h * hs, T, C, hs,
                   scale);
  });
}

void attention_backward(float* dqkv, const float* dout, const uint16_t* qkv16, const float* att, int B, int T, int C,
                        int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for_each_head(B * H, [&](int bh) {
    const int b = bh / H, h = bh % H;
    const uint16_t* q = qkv16 + (size_t)b * T * C3 + h * hs;
    float* dq = dqkv + (size_t)b * T * C3 + h * hs;
    backward_head16({q, q + C, q + 2 * C, C3}, att + (size_t)bh * T * T, dout + (size_t)b * T * C + h * hs, dq,
                    dq + C, dq + 2 * C, T, C, hs, scale);
  });
}

}  // namespace mt::nn
