// LayerNorm over channels. Statistics in float32 with a two-pass mean/variance (stable for the small C we
// use); backward uses the standard closed form
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w.
// Every channel loop is a SIMD loop (reductions in vector lanes, so the sums are reassociated: results
// differ from reference.cpp's sequential sums by float32 rounding). Rows are split across threads; the
// parameter gradients dw, db are summed over rows in row order by one thread, so they do not depend on
// the thread count. Cost per row: forward reads x twice (C floats, L1-resident) and writes out once;
// backward reads x and dout, adds into dinp.
#include <cmath>

#include "core/error.h"
#include "nn/layers.h"
#include "tensor/blas.h"

namespace mt::nn {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  const float eps = 1e-5f;
#pragma omp parallel for schedule(static) if (num_threads() > 1)
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + eps);
    float* o = out + (size_t)n * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

namespace {
// dinp rows [n0, n1); with params, also dw, db (+= in row order).
void layernorm_backward_rows(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                             const float* mean, const float* rstd, int n0, int n1, int C, bool params) {
  for (int n = n0; n < n1; n++) {
    const float* x = inp + (size_t)n * C;
    const float* g = dout + (size_t)n * C;
    const float m = mean[n], s = rstd[n];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
    for (int c = 0; c < C; c++) {
      float dxhat = g[c] * w[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * ((x[c] - m) * s);  // xhat first: O(1), no overflow for huge x
    }
    sum_dxhat /= C;
    sum_dxhat_xhat /= C;
    float* dx = dinp + (size_t)n * C;
    if (params) {
#pragma omp simd
      for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (g[c] * w[c] - sum_dxhat - xhat * sum_dxhat_xhat);
        dw[c] += g[c] * xhat;
        db[c] += g[c];
      }
    } else {
#pragma omp simd
      for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (g[c] * w[c] - sum_dxhat - xhat * sum_dxhat_xhat);
      }
    }
  }
}
}  // namespace

void layernorm_backward(float* dinp, GradOut dw_out, GradOut db_out, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  float* dw = dw_out.accumulator(C);
  float* db = db_out.accumulator(C);
  MT_ASSERT((dw == nullptr) == (db == nullptr), "layernorm_backward: dw and db are both given or both skipped");
  if (!dw) {  // the input half of a split backward
    if (!dinp) return;
#pragma omp parallel for schedule(static) if (num_threads() > 1)
    for (int n = 0; n < N; n++) layernorm_backward_rows(dinp, nullptr, nullptr, dout, inp, w, mean, rstd, n, n + 1, C, false);
    return;
  }
  if (dinp && num_threads() <= 1) {  // one pass: input and parameter gradients together
    layernorm_backward_rows(dinp, dw, db, dout, inp, w, mean, rstd, 0, N, C, true);
    return;
  }
  if (dinp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) layernorm_backward_rows(dinp, dw, db, dout, inp, w, mean, rstd, n, n + 1, C, false);
  }
  for (int n = 0; n < N; n++) {  // the parameter gradients (alone: the weight half of a split backward)
    const float* x = inp + (size_t)n * C;
    const float* g = dout + (size_t)n * C;
    const float m = mean[n], s = rstd[n];
#pragma omp simd
    for (int c = 0; c < C; c++) {
      dw[c] += g[c] * ((x[c] - m) * s);
      db[c] += g[c];
    }
  }
}

}  // namespace mt::nn
