// Tensor- and sequence-parallel building blocks over nn::TensorParallelOps (Megatron-LM's mappings and
// parallel layers), composed by model::Gpt. Each collective is named by what it does in both directions.
//
// Legend: S ranks in the tensor-parallel group, r this rank, N token rows of a micro-batch, Nr = N / S under
// sequence parallelism (else N), C model width, V vocabulary, [v0, v1) this rank's vocabulary rows.
//
//   TpRows::gather   forward: all-gather Nr -> N rows (SP; identity without)
//                    its backward pair is TpRows::reduce (a column-parallel product's input gradient)
//   TpRows::reduce   forward: sum over the group of N partial rows, keep my Nr rows (SP: reduce-scatter,
//                    else all-reduce) -- the row-parallel product's output; backward pair: gather
//   TpRows::sum_replicated   SP only: a replicated parameter's gradient computed from my rows, summed
//
// The linear layers split W[Cin, Cout] over the group (Megatron-LM's ColumnParallelLinear / RowParallelLinear):
//   column-parallel  rank r holds Cl = Cout / S output columns: W[Cin, Cl], b[Cl]
//     forward   out[N, Cl]  = f(inp) W + b       f = gather: the identity, or all-gather of the Nr rows (SP)
//     backward  dinp[Nr, Cin] = g(dout W^T)      g = reduce: all-reduce, or reduce-scatter (SP)
//               dW += f(inp)^T dout, db += column sums of dout (local: each rank owns its columns)
//   row-parallel     rank r holds Cl = Cin / S input rows: W[Cl, C], b[C] replicated
//     forward   out[Nr, C]  = g(inp W) + b (+ residual)
//     backward  dinp[N, Cl] = f(dout) W^T, dW += inp^T f(dout), db += column sums of f(dout)
//   Composed (column then row, as in a transformer block) the pair costs one g forward and one g backward.
//
// Cost per call, bytes per rank: gather and reduce move (S - 1) / S x N x C x 4 under SP (all-gather /
// reduce-scatter), an all-reduce 2 (S - 1) / S x N x C x 4 without. The vocabulary-parallel loss all-reduces
// 3 N floats (max, sum of exponentials, target logit); the logits are never gathered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "nn/weight.h"
#include "tensor/blas.h"

namespace mt::nn {

class TpRows {
 public:
  // tp null or size 1: no tensor parallelism (every call is the identity or a copy).
  TpRows(TensorParallelOps* tp, bool sequence_parallel) : tp_(tp), sp_(sequence_parallel && size() > 1) {}
  int size() const { return tp_ ? tp_->size() : 1; }
  int rank() const { return tp_ ? tp_->rank() : 0; }
  bool sequence_parallel() const { return sp_; }
  // Rows of the residual stream this rank holds for N rows (throws InputError when S does not divide N).
  int rows_here(int N) const;
  // All N rows of local[Nr, C]: `full` (scratch, N x C) under SP, else local itself.
  const float* gather(const float* local, float* full, int N, int C) const;
  // The same for rows kept in bf16 (half the bytes on the wire).
  const uint16_t* gather(const uint16_t* local16, uint16_t* full16, int N, int C) const;
  // local[Nr, C] = my rows of the sum over the group of full[N, C] (full is clobbered; local may be full).
  void reduce(float* full, float* local, int N, int C) const;
  // In-place all-reduce (no-op without tensor parallelism).
  void sum(float* buf, size_t n) const;
  // full[count] = every rank's local[count / S] in rank order, with or without SP (a copy when S is 1).
  void all_gather(const float* local, float* full, size_t count) const;
  // Adds to each parameter's gradient the group sum of its part (first min(numel, count) elements).
  void sum_replicated(std::initializer_list<std::pair<Param*, const float*>> parts, size_t count = SIZE_MAX);

 private:
  TensorParallelOps* tp_;
  bool sp_;
  std::vector<float> tmp_;
};

// Column-parallel linear (Megatron's ColumnParallelLinear), this rank's Cl output columns of W[Cin, S Cl] (a
// fused weight such as q|k|v holds the same share of each of its blocks; the product does not care).
// inp[Nr, Cin] (this rank's rows under SP, else all N); out[N, Cl]. inp_full: N x Cin scratch under SP (the
// gathered input, rebuilt in backward rather than kept), else unused (may be null).
void column_parallel_linear_forward(const TpRows& rows, float* inp_full, float* out, const float* inp, Weight W,
                                    const float* b, int N, int Cin, int Cl, Precision prec = Precision::fp32);
// dinp[Nr, Cin] = this rank's rows of the group sum of dout[N, Cl] W^T; dW[Cin, Cl] and db[Cl] (+)=.
// dinp_full: N x Cin scratch under SP (else the sum is formed in dinp).
void column_parallel_linear_backward(const TpRows& rows, float* inp_full, float* dinp_full, float* dinp, GradOut dW,
                                     GradOut db, const float* dout, const float* inp, Weight W, int N, int Cin,
                                     int Cl, Precision prec = Precision::fp32);
// Both with the input kept in bf16 (inp16[Nr, Cin], layers.h): under SP gathered in bf16 into inp_full16 (N x Cin
// scratch; half the bytes of the float32 gather, the same bits since the product rounds its input anyway).
void column_parallel_linear_forward(const TpRows& rows, uint16_t* inp_full16, float* out, const uint16_t* inp16,
                                    Weight W, const float* b, int N, int Cin, int Cl);
void column_parallel_linear_backward(const TpRows& rows, uint16_t* inp_full16, float* dinp_full, float* dinp,
                                     GradOut dW, GradOut db, const float* dout, const uint16_t* inp16, Weight W, int N,
                                     int Cin, int Cl);
// Megatron's optional gather_output: whole[N, S Cl] on every rank from each rank's part[N, Cl] in the full
// weight's column order (`blocks` equal blocks per part, e.g. 3 for q|k|v: block k of rank q lands at columns
// k S w + q w, w = Cl / blocks). parts: S x N x Cl scratch. Cost: an all-gather of N Cl floats per rank.
void gather_columns(const TpRows& rows, float* parts, float* whole, const float* part, int N, int Cl, int blocks = 1);
// Its backward pair: dpart[N, Cl] = this rank's columns of dwhole[N, S Cl] (no communication).
void split_columns(const TpRows& rows, float* dpart, const float* dwhole, int N, int Cl, int blocks = 1);

// Row-parallel linear (Megatron's RowParallelLinear): out[Nr, C] = residual + b + my rows of the group sum
// of inp[N, Cin] W[Cin, C] (each rank holds Cin of the full input width). partial: N x C scratch under SP.
void row_parallel_linear_forward(const TpRows& rows, float* partial, float* out, const float* inp, Weight W,
                                 const float* b, const float* residual, int N, int Cin, int C,
                                 Precision prec = Precision::fp32);
// dinp[N, Cin] = f(dout) W^T, dW[Cin, C] (+)= inp^T f(dout), db[C] (+)= column sums of f(dout), f(dout) = all N rows
// of dout[Nr, C] (dout_full: N x C scratch under SP, else unused). No reduction: every rank sees all rows.
void row_parallel_linear_backward(const TpRows& rows, float* dout_full, float* dinp, GradOut dW, GradOut db,
                                  const float* dout, const float* inp, Weight W, int N, int Cin, int C,
                                  Precision prec = Precision::fp32);
// Both with the input kept in bf16 (inp16[N, Cin]; layers.h's linear_* with a bf16 input): --precision bf16.
void row_parallel_linear_forward(const TpRows& rows, float* partial, float* out, const uint16_t* inp16, Weight W,
                                 const float* b, const float* residual, int N, int Cin, int C);
void row_parallel_linear_backward(const TpRows& rows, float* dout_full, float* dinp, GradOut dW, GradOut db,
                                  const float* dout, const uint16_t* inp16, Weight W, int N, int Cin, int C);

// Vocabulary-parallel logits of the tied head: a column-parallel product with W = wte^T, this rank holding
// vocabulary rows [v0, v1) of wte[V, C] (Vl = v1 - v0): logits[N, Vl] = f(x) wte[v0:v1]^T, x[Nr, C]. x_full: N x C
// scratch under SP (else unused). The logits are never gathered: the vocabulary-parallel loss reads them as they are.
void vocab_parallel_logits_forward(const TpRows& rows, float* x_full, float* logits, const float* x, Weight wte,
                                   int N, int C, int Vl, Precision prec = Precision::fp32);
// dx[Nr, C] = my rows of the group sum of dlogits wte[v0:v1] (dx_full: N x C scratch under SP), then
// dwte[Vl, C] (+)= dlogits^T f(x).
void vocab_parallel_logits_backward(const TpRows& rows, float* x_full, float* dx_full, float* dx, GradOut dwte,
                                    const float* dlogits, const float* x, Weight wte, int N, int C, int Vl,
                                    Precision prec = Precision::fp32);

// The same under --precision bf16 with x kept in bf16 (x16[Nr, C]; gathered in bf16 into x_full16, N x C, under SP):
// the results of the float32 x, bit for bit.
void vocab_parallel_logits_backward(const TpRows& rows, uint16_t* x_full16, float* dx_full, float* dx, GradOut dwte,
                                    const float* dlogits, const uint16_t* x16, Weight wte, int N, int C, int Vl);

// Vocabulary-parallel embedding: out[Nr, C] = my rows of the group sum of the rows this rank owns
// (zeros for other tokens). e: N x C scratch under SP (else out itself).
void vocab_parallel_embedding_forward(const TpRows& rows, float* e, float* out, const int32_t* ids, const float* wte,
                                      int64_t v0, int64_t v1, int N, int C);
// dwte[v1 - v0, C] += the gradient of the rows this rank owns; dall: all N rows' gradient.
void vocab_parallel_embedding_backward(float* dwte, const float* dall, const int32_t* ids, int64_t v0, int64_t v1,
                                       int N, int C);

// Softmax cross-entropy over a vocabulary split across the group: logits[N, v1 - v0] (my columns) become
// dlogits = (softmax - onehot) * dscale; returns the summed loss (the same on every rank).
double vocab_parallel_cross_entropy(TensorParallelOps& tp, float* logits, const int32_t* targets, int N, int64_t v0,
                                    int64_t v1, float dscale);

}  // namespace mt::nn
