// nn/tensor_parallel_layers.h with ranks as threads: the vocabulary-parallel loss against the single-process
// softmax cross-entropy (uneven vocabulary split), and the sequence-parallel paired collectives against the
// rows written out by hand.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "comm/types.h"
#include "nn/layers.h"
#include "nn/tensor_parallel_layers.h"

namespace {

// S threads as a tensor-parallel group: every collective posts this rank's buffer, meets at a barrier, and
// combines the posted buffers in rank order.
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
  void all_reduce_sum(float* buf, size_t n) override {
    combine(buf, n, [](float a, float b) { return a + b; });
  }
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

void run_ranks(int S, const std::function<void(mt::nn::TensorParallelOps&, int)>& body) {
  Group g(S);
  std::vector<std::thread> threads;
  for (int r = 0; r < S; r++)
    threads.emplace_back([&, r] {
      ThreadTp tp(g, r);
      body(tp, r);
    });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(TensorParallelLayers, VocabParallelLossMatchesTheWholeVocabulary) {
  const int N = 5, V = 10;
  const float dscale = 0.125f;
  std::vector<float> logits(N * V);
  for (int i = 0; i < N * V; i++) logits[i] = (float)((i * 37) % 23) * 0.25f - 2.0f;
  const std::vector<int32_t> targets = {0, 9, 4, 5, 3};
  std::vector<float> want = logits;
  const double want_loss = mt::nn::softmax_cross_entropy(want.data(), targets.data(), N, V, dscale, nullptr);
  for (int S : {1, 2, 3, 4}) {  // 10 over 3 and 4 is uneven: 4 3 3, 3 3 2 2
    std::vector<double> loss(S);
    std::vector<float> got(N * V, -99.0f);
    run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
      const mt::comm::Shard sh = mt::comm::shard_of(V, S, r);
      std::vector<float> mine(N * sh.count);
      for (int n = 0; n < N; n++)
        for (size_t j = 0; j < sh.count; j++) mine[n * sh.count + j] = logits[n * V + sh.offset + j];
      loss[r] = mt::nn::vocab_parallel_cross_entropy(tp, mine.data(), targets.data(), N, (int64_t)sh.offset,
                                                     (int64_t)(sh.offset + sh.count), dscale);
      for (int n = 0; n < N; n++)
        for (size_t j = 0; j < sh.count; j++) got[n * V + sh.offset + j] = mine[n * sh.count + j];
    });
    for (int r = 0; r < S; r++) EXPECT_NEAR(loss[r], want_loss, 1e-5 * std::abs(want_loss)) << "S " << S;
    for (int i = 0; i < N * V; i++) EXPECT_NEAR(got[i], want[i], 1e-7) << "S " << S << " element " << i;
  }
}

TEST(TensorParallelLayers, SequenceParallelRowsGatherAndReduce) {
  const int S = 3, N = 6, C = 2, Nr = N / S;
  run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
    mt::nn::TpRows rows(&tp, true);
    EXPECT_EQ(rows.rows_here(N), Nr);
    // Rank r holds rows [r Nr, (r + 1) Nr); row n, column c holds 10 n + c.
    std::vector<float> local(Nr * C), full(N * C);
    for (int n = 0; n < Nr; n++)
      for (int c = 0; c < C; c++) local[n * C + c] = 10.0f * (r * Nr + n) + c;
    const float* all = rows.gather(local.data(), full.data(), N, C);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) EXPECT_EQ(all[n * C + c], 10.0f * n + c);
    // Every rank contributes (r + 1) x row value: my rows of the sum are (1 + 2 + 3) x row value.
    std::vector<float> partial(N * C), mine(Nr * C);
    for (int i = 0; i < N * C; i++) partial[i] = (float)(r + 1) * all[i];
    rows.reduce(partial.data(), mine.data(), N, C);
    for (int n = 0; n < Nr; n++)
      for (int c = 0; c < C; c++) EXPECT_EQ(mine[n * C + c], 6.0f * (10.0f * (r * Nr + n) + c));
  });
  // Without sequence parallelism the reduce is an all-reduce of all N rows and gather the identity.
  run_ranks(2, [&](mt::nn::TensorParallelOps& tp, int r) {
    mt::nn::TpRows rows(&tp, false);
    std::vector<float> x = {1.0f + r, 2.0f, 3.0f, 4.0f * r};
    EXPECT_EQ(rows.gather(x.data(), nullptr, 2, 2), x.data());
    rows.reduce(x.data(), x.data(), 2, 2);
    EXPECT_EQ(x, (std::vector<float>{3.0f, 4.0f, 6.0f, 4.0f}));
  });
}
