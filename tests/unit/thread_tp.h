// Ranks as threads for unit tests of tensor-parallel code: S threads form a tensor-parallel group
// (nn::TensorParallelOps) in which every collective posts this rank's buffer, meets at a barrier, and combines
// the posted buffers in rank order (so a sum's bits do not depend on thread timing). Shared by
// tensor_parallel_layers_test.cpp and split_backward_test.cpp.
#pragma once

#include <algorithm>
#include <barrier>
#include <functional>
#include <vector>

#include "nn/tensor_parallel.h"

namespace mt::testing {

struct Group {
  explicit Group(int n) : S(n), bar(n), posted(n) {}
  int S;
  std::barrier<> bar;
  std::vector<std::vector<float>> posted;
};

class ThreadTp : public mt::nn::TensorParallelOps {
 public:
  ThreadTp(Group& g, int r) : g_(g), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return g_.S; }
  void all_reduce_sum(float* buf, size_t n) override { combine(buf, n, [](float a, float b) { return a + b; }); }
  void all_reduce_max(float* buf, size_t n) override {
    combine(buf, n, [](float a, float b) { return std::max(a, b); });
  }
  void all_gather(const float* local, float* full, size_t count) override {
    const size_t part = count / g_.S;
    g_.posted[r_].assign(local, local + part);
    g_.bar.arrive_and_wait();
    for (int q = 0; q < g_.S; q++)
      for (size_t i = 0; i < part; i++) full[q * part + i] = g_.posted[q][i];
    g_.bar.arrive_and_wait();
  }
  void reduce_scatter(const float* full, float* local, size_t count) override {
    const size_t part = count / g_.S;
    g_.posted[r_].assign(full, full + count);
    g_.bar.arrive_and_wait();
    for (size_t i = 0; i < part; i++) {
      float s = 0;
      for (int q = 0; q < g_.S; q++) s += g_.posted[q][r_ * part + i];
      local[i] = s;
    }
    g_.bar.arrive_and_wait();
  }

 private:
  void combine(float* buf, size_t n, const std::function<float(float, float)>& op) {
    g_.posted[r_].assign(buf, buf + n);
    g_.bar.arrive_and_wait();
    for (size_t i = 0; i < n; i++) {
      float v = g_.posted[0][i];
      for (int q = 1; q < g_.S; q++) v = op(v, g_.posted[q][i]);
      buf[i] = v;
    }
    g_.bar.arrive_and_wait();
  }
  Group& g_;
  int r_;
};

}  // namespace mt::testing
