#include "nn/tensor_parallel_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "nn/layers.h"
#include "tensor/bf16.h"
#include "tensor/blas.h"

namespace mt::nn {

int TpRows::rows_here(int N) const {
  if (!sp_) return N;
  MT_CHECK_INPUT(N % size() == 0, "--sequence-parallel splits the ", N, " token rows of a micro-batch ",
                 "(micro-batch size x --seq-len) over --tp ", size(), ": they must be divisible");
  return N / size();
}

const float* TpRows::gather(const float* local, float* full, int N, int C) const {
  if (!sp_) return local;
  tp_->all_gather(local, full, (size_t)N * C);
  return full;
}

const uint16_t* TpRows::gather(const uint16_t* local16, uint16_t* full16, int N, int C) const {
  if (!sp_) return local16;
  tp_->all_gather_bf16(local16, full16, (size_t)N * C);
  return full16;
}

void TensorParallelOps::all_gather_bf16(const uint16_t* local, uint16_t* full, size_t count) {
  const size_t part = count / size();
  std::vector<float> mine(part), all(count);
  for (size_t i = 0; i < part; i++) mine[i] = f32_from_bf16(local[i]);
  all_gather(mine.data(), all.data(), count);
  to_bf16(all.data(), full, count);
}

void TpRows::reduce(float* full, float* local, int N, int C) const {
  if (!sp_) {
    sum(full, (size_t)N * C);
    if (local != full) std::memcpy(local, full, sizeof(float) * N * C);
    return;
  }
  tp_->reduce_scatter(full, local, (size_t)N * C);
}

void TpRows::sum(float* buf, size_t n) const {
  if (size() > 1) tp_->all_reduce_sum(buf, n);
}

void TpRows::all_gather(const float* local, float* full, size_t count) const {
  if (size() > 1)
    tp_->all_gather(local, full, count);
  else
    std::memcpy(full, local, sizeof(float) * count);
}

void TpRows::sum_replicated(std::initializer_list<std::pair<Param*, const float*>> parts, size_t count) {
  // Each rank computed the gradient from its rows only: add the parts over the group (only this
  // micro-batch's contribution, which the caller computed into `parts`' temporaries, so earlier micro-batches
  // are not counted twice), packed into one all-reduce.
  size_t total = 0;
  for (auto& [p, g] : parts) total += std::min(p->numel, count);
  tmp_.resize(total);
  size_t off = 0;
  for (auto& [p, g] : parts) {
    const size_t n = std::min(p->numel, count);
    std::memcpy(tmp_.data() + off, g, sizeof(float) * n);
    off += n;
  }
  sum(tmp_.data(), total);
  off = 0;
  for (auto& [p, g] : parts) {
    const size_t n = std::min(p->numel, count);
    float* d = p->grad_acc();
    for (size_t i = 0; i < n; i++) d[i] += tmp_[off + i];
    off += n;
  }
}

void column_parallel_linear_forward(const TpRows& rows, float* inp_full, float* out, const float* inp, Weight W,
                                    const float* b, int N, int Cin, int Cl, Precision prec) {
  linear_forward(out, rows.gather(inp, inp_full, N, Cin), W, b, N, Cin, Cl, nullptr, prec);
}

void column_parallel_linear_backward(const TpRows& rows, float* inp_full, float* dinp_full, float* dinp, GradOut dW,
                                     GradOut db, const float* dout, const float* inp, Weight W, int N, int Cin,
                                     int Cl, Precision prec) {
  // Each rank's dinp is the part of the input gradient flowing through its columns: the whole is their sum.
  // A split backward's halves: dinp null skips the input gradient and its reduction, dW null the weight
  // gradient and the gather of the input (under SP) it reads.
  float* partial = !dinp ? nullptr : rows.sequence_parallel() ? dinp_full : dinp;
  linear_backward(partial, dW, db, dout, dW ? rows.gather(inp, inp_full, N, Cin) : inp, W, N, Cin, Cl, false, prec);
  if (dinp) rows.reduce(partial, dinp, N, Cin);
}

void column_parallel_linear_forward(const TpRows& rows, uint16_t* inp_full16, float* out, const uint16_t* inp16,
                                    Weight W, const float* b, int N, int Cin, int Cl) {
  linear_forward(out, rows.gather(inp16, inp_full16, N, Cin), W, b, N, Cin, Cl);
}

void column_parallel_linear_backward(const TpRows& rows, uint16_t* inp_full16, float* dinp_full, float* dinp,
                                     GradOut dW, GradOut db, const float* dout, const uint16_t* inp16, Weight W, int N,
                                     int Cin, int Cl) {
  // A split backward's halves as in the float32 form above.
  float* partial = !dinp ? nullptr : rows.sequence_parallel() ? dinp_full : dinp;
  linear_backward(partial, dW, db, dout, dW ? rows.gather(inp16, inp_full16, N, Cin) : inp16, W, N, Cin, Cl, false);
  if (dinp) rows.reduce(partial, dinp, N, Cin);
}

void gather_columns(const TpRows& rows, float* parts, float* whole, const float* part, int N, int Cl, int blocks) {
  MT_ASSERT(blocks >= 1 && Cl % blocks == 0, "gather_columns: ", Cl, " columns in ", blocks, " blocks");
  const int S = rows.size(), w = Cl / blocks;
  rows.all_gather(part, parts, (size_t)S * N * Cl);
  for (int q = 0; q < S; q++)
    for (int n = 0; n < N; n++)
      for (int k = 0; k < blocks; k++)
        std::memcpy(whole + (size_t)n * S * Cl + (size_t)k * S * w + (size_t)q * w,
                    parts + ((size_t)q * N + n) * Cl + (size_t)k * w, sizeof(float) * w);
}

void split_columns(const TpRows& rows, float* dpart, const float* dwhole, int N, int Cl, int blocks) {
  MT_ASSERT(blocks >= 1 && Cl % blocks == 0, "split_columns: ", Cl, " columns in ", blocks, " blocks");
  const int S = rows.size(), r = rows.rank(), w = Cl / blocks;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < blocks; k++)
      std::memcpy(dpart + (size_t)n * Cl + (size_t)k * w, dwhole + (size_t)n * S * Cl + (size_t)k * S * w + (size_t)r * w,
                  sizeof(float) * w);
}

namespace {

// Precision of a layer input: as asked for float32, bf16 for an input kept in bf16.
void row_forward(const TpRows& rows, float* partial, float* out, const auto* inp, Weight W, const float* b,
                 const float* residual, int N, int Cin, int C, Precision prec) {
  auto linear = [&](float* o, const float* bb, const float* r) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*inp)>, uint16_t>)
      linear_forward(o, inp, W, bb, N, Cin, C, r);
    else
      linear_forward(o, inp, W, bb, N, Cin, C, r, prec);
  };
  if (rows.size() == 1) return linear(out, b, residual);  // bias and residual fused into the GEMM
  // Under sequence parallelism only this rank's rows of the sum (reduce-scatter), with its rows of the
  // residual.
  const int Nr = rows.rows_here(N);
  if (!rows.sequence_parallel()) partial = out;
  linear(partial, nullptr, nullptr);
  rows.reduce(partial, out, N, C);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < Nr; n++) {
    float* o = out + (size_t)n * C;
    const float* r = residual + (size_t)n * C;
    for (int j = 0; j < C; j++) o[j] += r[j] + b[j];
  }
}

}  // namespace

void row_parallel_linear_backward(const TpRows& rows, float* dout_full, float* dinp, GradOut dW, GradOut db,
                                  const float* dout, const float* inp, Weight W, int N, int Cin, int C,
                                  Precision prec) {
  linear_backward(dinp, dW, db, rows.gather(dout, dout_full, N, C), inp, W, N, Cin, C, false, prec);
}
void row_parallel_linear_backward(const TpRows& rows, float* dout_full, float* dinp, GradOut dW, GradOut db,
                                  const float* dout, const uint16_t* inp16, Weight W, int N, int Cin, int C) {
  linear_backward(dinp, dW, db, rows.gather(dout, dout_full, N, C), inp16, W, N, Cin, C, false);
}

void row_parallel_linear_forward(const TpRows& rows, float* partial, float* out, const float* inp, Weight W,
                                 const float* b, const float* residual, int N, int Cin, int C, Precision prec) {
  row_forward(rows, partial, out, inp, W, b, residual, N, Cin, C, prec);
}
void row_parallel_linear_forward(const TpRows& rows, float* partial, float* out, const uint16_t* inp16, Weight W,
                                 const float* b, const float* residual, int N, int Cin, int C) {
  row_forward(rows, partial, out, inp16, W, b, residual, N, Cin, C, Precision::bf16);
}

void vocab_parallel_logits_forward(const TpRows& rows, float* x_full, float* logits, const float* x, Weight wte,
                                   int N, int C, int Vl, Precision prec) {
  const float* xg = rows.gather(x, x_full, N, C);
  if (prec == Precision::bf16 && wte.b16)  // wte's mirror: no rounding pass over the Vl x C table
    return gemm_16(false, true, N, Vl, C, 1.0f, packed_bf16_scratch(1, xg, N, C, C), C, wte.b16, C, 0.0f, logits, Vl);
  gemm(false, true, N, Vl, C, 1.0f, xg, C, wte.f32, C, 0.0f, logits, Vl, prec);
}

namespace {

// Under bf16: dlogits (N x Vl, the largest operand of the step) feeds both products, so it is rounded once, not
// once per product. x16(): all N rows of x in bf16, asked for after dx is formed.
template <class X16>
void logits_backward_bf16(const TpRows& rows, float* dx_full, float* dx, GradOut dwte, const float* dlogits, Weight wte,
                          int N, int C, int Vl, X16 x16) {
  // Each rank's vocabulary rows contribute their share of dx: the whole is their sum.
  float* partial = rows.sequence_parallel() ? dx_full : dx;
  // A split backward's halves: dx null skips the input gradient, dwte null the weight gradient.
  const uint16_t* d16 = packed_bf16_scratch(0, dlogits, N, Vl, Vl);
  if (dx) {
    if (wte.b16)
      gemm_16(false, false, N, C, Vl, 1.0f, d16, Vl, wte.b16, C, 0.0f, partial, C);
    else
      gemm_a16(false, false, N, C, Vl, 1.0f, d16, Vl, wte.f32, C, 0.0f, partial, C);
    rows.reduce(partial, dx, N, C);
  }
  if (dwte) gemm_16(true, false, Vl, C, N, 1.0f, d16, Vl, x16(), C, dwte.beta(), dwte.data, C);
}

}  // namespace

void vocab_parallel_logits_backward(const TpRows& rows, float* x_full, float* dx_full, float* dx, GradOut dwte,
                                    const float* dlogits, const float* x, Weight wte, int N, int C, int Vl,
                                    Precision prec) {
  if (prec == Precision::bf16)
    return logits_backward_bf16(rows, dx_full, dx, dwte, dlogits, wte, N, C, Vl, [&] {
      return packed_bf16_scratch(1, rows.gather(x, x_full, N, C), N, C, C);
    });
  // Each rank's vocabulary rows contribute their share of dx: the whole is their sum.
  // A split backward's halves: dx null skips the input gradient, dwte null the weight gradient.
  float* partial = rows.sequence_parallel() ? dx_full : dx;
  if (dx) {
    gemm(false, false, N, C, Vl, 1.0f, dlogits, Vl, wte.f32, C, 0.0f, partial, C, prec);
    rows.reduce(partial, dx, N, C);
  }
  if (dwte)
    gemm(true, false, Vl, C, N, 1.0f, dlogits, Vl, rows.gather(x, x_full, N, C), C, dwte.beta(), dwte.data, C, prec);
}

void vocab_parallel_logits_backward(const TpRows& rows, uint16_t* x_full16, float* dx_full, float* dx, GradOut dwte,
                                    const float* dlogits, const uint16_t* x16, Weight wte, int N, int C, int Vl) {
  logits_backward_bf16(rows, dx_full, dx, dwte, dlogits, wte, N, C, Vl,
                       [&] { return rows.gather(x16, x_full16, N, C); });
}

void vocab_parallel_embedding_forward(const TpRows& rows, float* e, float* out, const int32_t* ids, const float* wte,
                                      int64_t v0, int64_t v1, int N, int C) {
  // Rows this rank owns, zeros elsewhere, summed over the group (reduce-scattered to each rank's rows under
  // sequence parallelism).
  if (!rows.sequence_parallel()) e = out;
  std::memset(e, 0, sizeof(float) * N * C);
  for (int n = 0; n < N; n++)
    if (ids[n] >= v0 && ids[n] < v1) std::memcpy(e + (size_t)n * C, wte + (size_t)(ids[n] - v0) * C, sizeof(float) * C);
  rows.reduce(e, out, N, C);
}

void vocab_parallel_embedding_backward(float* dwte, const float* dall, const int32_t* ids, int64_t v0, int64_t v1,
                                       int N, int C) {
  // The vocabulary rows this rank owns may be used by any token.
  for (int n = 0; n < N; n++) {
    if (ids[n] < v0 || ids[n] >= v1) continue;
    float* d = dwte + (size_t)(ids[n] - v0) * C;
    const float* g = dall + (size_t)n * C;
    for (int c = 0; c < C; c++) d[c] += g[c];
  }
}

// Per row, the group's max, then the sum of exponentials, then the target's logit (owned by one rank) are
// all-reduced.
double vocab_parallel_cross_entropy(TensorParallelOps& tp, float* logits, const int32_t* targets, int N, int64_t v0,
                                    int64_t v1, float dscale) {
  const int Vl = (int)(v1 - v0);
  std::vector<float> mx(N), se(N), xt(N, 0.0f);
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * Vl;
    float m = -INFINITY;
    for (int j = 0; j < Vl; j++) m = std::max(m, x[j]);
    mx[n] = m;
  }
  tp.all_reduce_max(mx.data(), N);
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * Vl;
    float sum = 0.0f;
    for (int j = 0; j < Vl; j++) sum += std::exp(x[j] - mx[n]);
    se[n] = sum;
    if (targets[n] >= v0 && targets[n] < v1) xt[n] = x[targets[n] - v0];
  }
  tp.all_reduce_sum(se.data(), N);
  tp.all_reduce_sum(xt.data(), N);
  double total = 0.0;
  for (int n = 0; n < N; n++) {
    float lz = mx[n] + std::log(se[n]);
    total += lz - xt[n];
    float* x = logits + (size_t)n * Vl;
    for (int j = 0; j < Vl; j++) x[j] = std::exp(x[j] - lz) * dscale;
    if (targets[n] >= v0 && targets[n] < v1) x[targets[n] - v0] -= dscale;
  }
  return total;
}

}  // namespace mt::nn
