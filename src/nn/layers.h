// Layer kernels with explicit forward and backward. They keep no state: forward writes what backward needs
// into buffers the caller owns (the activation store), so several micro-batches can be in flight at once.
//
// Legend: N rows (B*T tokens or batch examples), C input channels, OC output channels, B batch, T time,
// H heads, hs = C/H head size, V vocabulary. All buffers float32, contiguous, row-major.
// Products (linear, attention) take a Precision (tensor/blas.h): bf16 rounds both inputs of every product, forward
// and backward, to bfloat16 and accumulates in float32 (--precision bf16); everything else stays float32.
// Backward conventions: parameter gradients (dW, db, ...) are GradOuts (grad_out.h): added to (+=), so
// micro-batches add up, or written when the GradOut says it is the step's first write; input gradients are
// overwritten unless the function says "accumulated".
#pragma once

#include <cstddef>
#include <cstdint>

#include "nn/grad_out.h"
#include "nn/weight.h"
#include "tensor/blas.h"

namespace mt::nn {

// Linear in Conv1D layout: out[N,OC] = inp[N,C] W[C,OC] + b[OC] (+ residual[N,OC]). b and residual may be
// null; residual may alias out. Fusing the residual add saves one pass and one [N,OC] buffer. W: its float32
// values and, under bf16, its bf16 mirror when the store keeps one (weight.h).
void linear_forward(float* out, const float* inp, Weight W, const float* b, int N, int C, int OC,
                    const float* residual = nullptr, Precision prec = Precision::fp32);
// dinp[N,C] = dout W^T (or += when accumulate_dinp; dinp may be null to skip); dW[C,OC] (+)= inp^T dout;
// db[OC] (+)= column sums of dout (db may be null). dW null skips the weight product: a split backward (a
// pipeline's zero-bubble schedules) calls once with dW, db null (its input half) and once with dinp null (its
// weight half), the same products as one call, bit for bit.
void linear_backward(float* dinp, GradOut dW, GradOut db, const float* dout, const float* inp, Weight W, int N,
                     int C, int OC, bool accumulate_dinp = false, Precision prec = Precision::fp32);
// The same with the input kept in bf16 (inp16[N,C], rounded once in forward; --precision bf16 only): the input is
// read only by products (out = inp W, dW = inp^T dout), which round it to bf16 anyway, so the results are those
// of the float32 input under Precision::bf16, bit for bit, from half the memory and without repacking it.
void linear_forward(float* out, const uint16_t* inp16, Weight W, const float* b, int N, int C, int OC,
                    const float* residual = nullptr);
void linear_backward(float* dinp, GradOut dW, GradOut db, const float* dout, const uint16_t* inp16, Weight W,
                     int N, int C, int OC, bool accumulate_dinp = false);

// Embedding lookup: out[N,C] (+)= table[ids[n], :]. Each id must be < rows of table (checked by callers
// at the data boundary, not here).
void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C, bool accumulate);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C);

// LayerNorm over the last axis, eps 1e-5: out[N,C], mean[N], rstd[N] saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C);
// dinp[N,C] accumulated (+=: LayerNorm sits on the residual stream); dw, db (+)=. For a split backward, dinp
// null skips the input gradient and dw, db null (both) skip the parameter gradients; the two halves give the
// bits of one call.
void layernorm_backward(float* dinp, GradOut dw, GradOut db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out and inp may alias.
void gelu_forward(float* out, const float* inp, size_t n);
// The same output rounded to bf16 (out16[i] = bf16(gelu(inp[i]))) for a product's input kept in bf16.
void gelu_forward_bf16(uint16_t* out16, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// ReLU. out and inp may alias; backward uses the forward output (y > 0 iff x > 0).
void relu_forward(float* out, const float* inp, size_t n);
void relu_backward(float* dinp, const float* out, const float* dout, size_t n);

// Residual add: out = a + b. Its backward hands dout to both branches unchanged (done by the caller).
void residual_forward(float* out, const float* a, const float* b, size_t n);

// Causal multi-head self-attention on a fused qkv[B,T,3C] (q, k, v in that order along the last axis,
// heads split as [H, hs] within each). out[B,T,C]; att[B,H,T,T] holds the softmax probabilities
// (upper triangle zero) for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H,
                       Precision prec = Precision::fp32);
// dqkv[B,T,3C] overwritten.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H,
                        Precision prec = Precision::fp32);
// The same under --precision bf16 with qkv kept in bf16 (qkv16[B,T,3C], rounded once after its product: only
// products read q, k and v): the results of the float32 qkv under Precision::bf16, from half its bytes.
void attention_forward(float* out, float* att, const uint16_t* qkv16, int B, int T, int C, int H);
void attention_backward(float* dqkv, const float* dout, const uint16_t* qkv16, const float* att, int B, int T, int C,
                        int H);

// Softmax cross-entropy, fused with its backward: logits[N,V] is overwritten by
// dlogits = (softmax(logits) - onehot(target)) * dscale. Returns the sum over rows of -log p[target].
// losses[N] (optional) receives each row's loss.
double softmax_cross_entropy(float* logits, const int32_t* targets, int N, int V, float dscale, float* losses);
// Forward only (evaluation): sum of -log p[target]; logits unchanged. correct (optional) counts argmax hits.
double cross_entropy_loss(const float* logits, const int32_t* targets, int N, int V, int64_t* correct);

}  // namespace mt::nn
