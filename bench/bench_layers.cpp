// Micro-benchmarks of the GPT layer kernels at the gpt-bench shape (B=8, T=256, C=384, H=6), one thread.
// Each benchmark checks a result before timing (state.SkipWithError on a mismatch), so a fast wrong kernel
// never reports a number. Run: build/bench/bench_layers [--benchmark_filter=Attention]
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "nn/layers.h"
#include "tensor/blas.h"

namespace {

constexpr int B = 8, T = 256, C = 384, H = 6, N = B * T;

std::vector<float> randn(size_t n, const char* stream) {
  mt::CounterRng r(1, stream);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)r.normal(i);
  return v;
}

void BM_AttentionForward(benchmark::State& state) {
  mt::set_num_threads(1);
  auto qkv = randn((size_t)N * 3 * C, "qkv");
  std::vector<float> out((size_t)N * C), att((size_t)B * H * T * T);
  mt::nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  double s = 0;
  for (int j = 0; j < T; j++) s += att[(size_t)(T - 1) * T + j];
  if (std::fabs(s - 1.0) > 1e-4) state.SkipWithError("attention row does not sum to 1");
  for (auto _ : state) mt::nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  // Causal: half of the dense 4 B T^2 C FLOPs.
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * B * T * (double)T * C * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMillisecond);

void BM_AttentionBackward(benchmark::State& state) {
  mt::set_num_threads(1);
  auto qkv = randn((size_t)N * 3 * C, "qkv"), dout = randn((size_t)N * C, "dout");
  std::vector<float> out((size_t)N * C), att((size_t)B * H * T * T), dqkv((size_t)N * 3 * C);
  mt::nn::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  for (auto _ : state) mt::nn::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, H);
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * B * T * (double)T * C * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionBackward)->Unit(benchmark::kMillisecond);

void BM_Gelu(benchmark::State& state) {
  const size_t n = (size_t)N * 4 * C;
  auto x = randn(n, "x");
  std::vector<float> y(n);
  mt::nn::gelu_forward(y.data(), x.data(), n);
  for (size_t i = 0; i < n; i += 9973) {
    double v = x[i], ref = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    if (std::fabs(y[i] - ref) > 1e-5 * (1 + std::fabs(ref))) state.SkipWithError("gelu mismatch");
  }
  for (auto _ : state) mt::nn::gelu_forward(y.data(), x.data(), n);
  state.SetBytesProcessed((int64_t)state.iterations() * n * 8);
}
BENCHMARK(BM_Gelu)->Unit(benchmark::kMillisecond);

void BM_LayerNormForward(benchmark::State& state) {
  auto x = randn((size_t)N * C, "x"), w = randn(C, "w"), b = randn(C, "b");
  std::vector<float> y((size_t)N * C), mean(N), rstd(N);
  for (auto _ : state) mt::nn::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  state.SetBytesProcessed((int64_t)state.iterations() * N * C * 8);
}
BENCHMARK(BM_LayerNormForward)->Unit(benchmark::kMillisecond);

void BM_SoftmaxCrossEntropy(benchmark::State& state) {
  const int V = 8192;
  auto logits = randn((size_t)N * V, "logits");
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; i++) targets[i] = (i * 31) % V;
  std::vector<float> work = logits;
  double loss = mt::nn::softmax_cross_entropy(work.data(), targets.data(), N, V, 1.0f / N, nullptr) / N;
  if (!(loss > std::log((double)V) - 1 && loss < std::log((double)V) + 2))  // random logits: ~log V + 1/2
    state.SkipWithError("cross-entropy of random logits out of range");
  for (auto _ : state) {
    state.PauseTiming();
    work = logits;
    state.ResumeTiming();
    benchmark::DoNotOptimize(mt::nn::softmax_cross_entropy(work.data(), targets.data(), N, V, 1.0f / N, nullptr));
  }
  state.SetBytesProcessed((int64_t)state.iterations() * N * (int64_t)V * 8);
}
BENCHMARK(BM_SoftmaxCrossEntropy)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
