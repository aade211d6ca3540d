// FMA peak: each thread keeps kChains independent accumulators, so the FMA units never wait on a previous
// result (latency 4 cycles x 2 pipes = 8 chains in flight suffice on current x86; 16 leave a margin), and
// repeats acc = acc * x + y, with x and y close to 1 so values stay finite. The rate counts 2 FLOP per lane.
// The bf16 peak: the same chains of vdpbf16ps (acc += a0 b0 + a1 b1 per float32 lane, 4 FLOP per lane), compiled
// for avx512_bf16 whatever the build's -march and run only where CPUID reports it.
#include "tensor/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <time.h>

namespace mt {

namespace {

constexpr int kChains = 16;
constexpr long kInner = 1 << 16;

#if defined(__x86_64__)
// The sum of every lane of the kChains accumulators: what the AVX-512 bursts return. (Stored and added lane by
// lane: g++ 12's _mm512_reduce_add_ps reads an uninitialized register in its header, -Wuninitialized.)
[[gnu::target("avx512f")]] float sum_chains(const __m512* acc) {
  __m512 s = acc[0];
  for (int c = 1; c < kChains; c++) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}
#endif

// One burst of kInner rounds over kChains accumulators; returns a value so the work is not optimized away.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr const char* kIsa = "avx512";
float burst(float xv) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; c++) acc[c] = _mm512_set1_ps(1.0f + c * 1e-3f);
  const __m512 x = _mm512_set1_ps(xv), y = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < kInner; i++)
    for (int c = 0; c < kChains; c++) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  return sum_chains(acc);
}
#elif defined(__FMA__) && defined(__AVX2__)
constexpr int kLanes = 8;
constexpr const char* kIsa = "avx2";
float burst(float xv) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; c++) acc[c] = _mm256_set1_ps(1.0f + c * 1e-3f);
  const __m256 x = _mm256_set1_ps(xv), y = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < kInner; i++)
    for (int c = 0; c < kChains; c++) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; c++) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}
#else
constexpr int kLanes = 1;
constexpr const char* kIsa = "scalar";
float burst(float xv) {
  float acc[kChains];
  for (int c = 0; c < kChains; c++) acc[c] = 1.0f + c * 1e-3f;
  for (long i = 0; i < kInner; i++)
    for (int c = 0; c < kChains; c++) acc[c] = acc[c] * xv + 1e-6f;
  float r = 0;
  for (float v : acc) r += v;
  return r;
}
#endif

// CPU time of the calling thread: the rate per second of core actually received, so neighbours sharing the
// cores do not lower the ceiling (they lower wall-clock throughput, which bench train reports separately).
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#if defined(__x86_64__)
[[gnu::target("avx512f,avx512bf16")]] float burst_bf16(float xv) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; c++) acc[c] = _mm512_set1_ps(1.0f + c * 1e-3f);
  // Products of about 1e-6: 2^16 rounds add ~0.1 to each lane, which stays finite and exact enough.
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(xv * 1e-3f), _mm512_set1_ps(xv * 1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (long i = 0; i < kInner; i++)
    for (int c = 0; c < kChains; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  return sum_chains(acc);
}
bool has_bf16() { return __builtin_cpu_supports("avx512bf16"); }
#else
float burst_bf16(float) { return 0; }
bool has_bf16() { return false; }
#endif

// Sum over `threads` threads of FLOP per second of CPU time, running burst_fn repeatedly for ~seconds each.
template <class F>
double measure(int threads, double seconds, double flop_per_burst, F burst_fn) {
  double total = 0;
  volatile float sink = 0, x = 0.999999f;  // volatile: each burst is computed, not folded or reused
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    sink = sink + burst_fn(x);  // warm-up: clocks up, AVX-512 units powered
    long bursts = 0;
    float s = 0;
    const double t0 = thread_cpu_seconds();
    double dt = 0;
    while (dt < seconds) {
      for (int k = 0; k < 8; k++, bursts++) s += burst_fn(x);
      dt = thread_cpu_seconds() - t0;
    }
    total += bursts * flop_per_burst / dt;
    sink = sink + s;
  }
  return total / 1e9;
}

}  // namespace

FmaPeak measure_fma_peak(int threads, double seconds) {
  FmaPeak p;
  p.threads = threads;
  p.isa = kIsa;
  p.gflops = measure(threads, seconds, 2.0 * kLanes * kChains * (double)kInner, burst);
  return p;
}

FmaPeak measure_bf16_peak(int threads, double seconds) {
  FmaPeak p;
  p.threads = threads;
  p.isa = has_bf16() ? "avx512_bf16" : "none";
  if (has_bf16()) p.gflops = measure(threads, seconds, 4.0 * 16 * kChains * (double)kInner, burst_bf16);
  return p;
}

}  // namespace mt
