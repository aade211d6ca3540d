// Plain reference versions of the element-wise kernels in layers.h: one scalar loop per formula, libm's
// exp/tanh/log, float32 with the same accumulation order as written. They are what the fast kernels (fused,
// vectorized, fewer passes over memory) are tested against in tests/unit/kernels_reference_test.cpp; the
// models never call them. Same signatures and conventions as layers.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::nn::ref {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
double softmax_cross_entropy(float* logits, const int32_t* targets, int N, int V, float dscale, float* losses);
// Causal attention, dense T x T per (b, h) with no tiling.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int H);

}  // namespace mt::nn::ref
