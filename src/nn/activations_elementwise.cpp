// Elementwise layers: GELU (tanh form), ReLU and the residual add.
#include "nn/layers.h"
#include "tensor/bf16.h"
#include "tensor/vmath.h"

namespace mt::nn {

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float t = fast_tanh(kGeluK * (x + kGeluC * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

void gelu_forward_bf16(uint16_t* out, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float t = fast_tanh(kGeluK * (x + kGeluC * x * x * x));
    out[i] = bf16_from_f32(0.5f * x * (1.0f + t));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float t = fast_tanh(kGeluK * (x + kGeluC * x * x * x));
    float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * dt);
  }
}

void relu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void relu_backward(float* dinp, const float* out, const float* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

}  // namespace mt::nn
