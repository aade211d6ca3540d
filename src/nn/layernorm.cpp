// LayerNorm over channels. Statistics in float32 with a two-pass mean/variance (stable for the small C we
// use); backward uses the standard closed form
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w.
#include <cmath>

#include "nn/layers.h"

namespace mt::nn {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  const float eps = 1e-5f;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) {
      float d = x[c] - m;
      v += d * d;
    }
    v /= C;
    float s = 1.0f / std::sqrt(v + eps);
    float* o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  // Input gradients in parallel over rows; dw/db summed serially afterwards so results do not depend on the
  // thread count.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    const float* g = dout + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      float dxhat = g[c] * w[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
    }
    sum_dxhat /= C;
    sum_dxhat_xhat /= C;
    float* dx = dinp + (size_t)n * C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      float dxhat = g[c] * w[c];
      dx[c] += s * (dxhat - sum_dxhat - xhat * sum_dxhat_xhat);
    }
  }
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    const float* g = dout + (size_t)n * C;
    float m = mean[n], s = rstd[n];
#pragma omp simd
    for (int c = 0; c < C; c++) {
      dw[c] += g[c] * (x[c] - m) * s;
      db[c] += g[c];
    }
  }
}

}  // namespace mt::nn
