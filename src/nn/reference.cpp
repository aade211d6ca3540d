// Reference kernels (see reference.h): straight loops, no OpenMP, no SIMD hints, libm transcendentals.
#include "nn/reference.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace mt::nn::ref {

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + 1e-5f);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    const float* g = dout + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int c = 0; c < C; c++) {
      sum_dxhat += g[c] * w[c];
      sum_dxhat_xhat += g[c] * w[c] * ((x[c] - m) * s);
    }
    sum_dxhat /= C;
    sum_dxhat_xhat /= C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      dinp[(size_t)n * C + c] += s * (g[c] * w[c] - sum_dxhat - xhat * sum_dxhat_xhat);
      dw[c] += g[c] * xhat;
      db[c] += g[c];
    }
  }
}

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluK * (x + kGeluC * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float t = std::tanh(kGeluK * (x + kGeluC * x * x * x));
    float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * dt);
  }
}

double softmax_cross_entropy(float* logits, const int32_t* targets, int N, int V, float dscale, float* losses) {
  double total = 0.0;
  for (int n = 0; n < N; n++) {
    float* x = logits + (size_t)n * V;
    float mx = x[0];
    for (int j = 1; j < V; j++) mx = std::fmax(mx, x[j]);
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += std::exp((double)x[j] - mx);
    double lz = mx + std::log(sum);
    double loss = lz - x[targets[n]];
    if (losses) losses[n] = (float)loss;
    total += loss;
    for (int j = 0; j < V; j++) x[j] = (float)(std::exp((double)x[j] - lz) * dscale);
    x[targets[n]] -= dscale;
  }
  return total;
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const float* q = qkv + (size_t)b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* P = att + ((size_t)b * H + h) * T * T;
      for (int t = 0; t < T; t++) {
        float* p = P + (size_t)t * T;
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
          float s = 0.0f;
          for (int d = 0; d < hs; d++) s += q[(size_t)t * C3 + d] * k[(size_t)j * C3 + d];
          p[j] = s * scale;
          mx = std::fmax(mx, p[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j < T; j++) p[j] = j <= t ? p[j] / sum : 0.0f;
        float* y = out + ((size_t)b * T + t) * C + h * hs;
        for (int d = 0; d < hs; d++) {
          float s = 0.0f;
          for (int j = 0; j <= t; j++) s += p[j] * v[(size_t)j * C3 + d];
          y[d] = s;
        }
      }
    }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) std::memset(dqkv + ((size_t)b * T + t) * C3, 0, sizeof(float) * C3);
  std::vector<float> dp(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const float* q = qkv + (size_t)b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + (size_t)b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* P = att + ((size_t)b * H + h) * T * T;
      for (int t = 0; t < T; t++) {
        const float* p = P + (size_t)t * T;
        const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
        float dot = 0.0f;
        for (int j = 0; j <= t; j++) {
          float s = 0.0f;
          for (int d = 0; d < hs; d++) s += dy[d] * v[(size_t)j * C3 + d];
          dp[j] = s;
          dot += p[j] * s;
        }
        for (int j = 0; j <= t; j++) {
          float ds = p[j] * (dp[j] - dot) * scale;
          for (int d = 0; d < hs; d++) {
            dq[(size_t)t * C3 + d] += ds * k[(size_t)j * C3 + d];
            dk[(size_t)j * C3 + d] += ds * q[(size_t)t * C3 + d];
            dv[(size_t)j * C3 + d] += p[j] * dy[d];
          }
        }
      }
    }
}

}  // namespace mt::nn::ref
