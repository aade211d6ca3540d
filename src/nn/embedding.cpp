// Embedding lookup (token and position tables) and its scatter-add backward.
#include <cstring>

#include "nn/layers.h"

namespace mt::nn {

void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* o = out + (size_t)n * C;
    const float* row = table + (size_t)ids[n] * C;
    if (accumulate) {
      for (int c = 0; c < C; c++) o[c] += row[c];
    } else {
      std::memcpy(o, row, sizeof(float) * C);
    }
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C) {
  // Serial over rows: two rows may share an id, and the summation order must not depend on threads.
  for (int n = 0; n < N; n++) {
    float* d = dtable + (size_t)ids[n] * C;
    const float* g = dout + (size_t)n * C;
    for (int c = 0; c < C; c++) d[c] += g[c];
  }
}

}  // namespace mt::nn
