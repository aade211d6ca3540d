#include "comm/copy.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/env.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mt::comm {

namespace {

#if defined(__AVX512F__)
constexpr size_t kVec = 64;
using Vec = __m512i;
inline Vec load(const char* p) { return _mm512_loadu_si512(p); }
inline void store_aligned(char* p, Vec v) { _mm512_store_si512(p, v); }
inline void store_stream(char* p, Vec v) { _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v); }
inline void store_unaligned(char* p, Vec v) { _mm512_storeu_si512(p, v); }
#elif defined(__AVX2__)
constexpr size_t kVec = 32;
using Vec = __m256i;
inline Vec load(const char* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store_aligned(char* p, Vec v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline void store_stream(char* p, Vec v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); }
inline void store_unaligned(char* p, Vec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
// n >= 4 * kVec. The first vector is stored unaligned, then the loop runs on kVec-aligned destinations
// (it may rewrite a few head bytes with the same values), and the last 4 vectors are stored from the
// end (again overlapping the loop's last bytes; overlapping bytes get the same values, so the order of
// streamed and ordinary stores to them does not matter). Source and destination must not overlap.
template <bool kStream>
void copy_vec(char* d, const char* s, size_t n) {
  const Vec first = load(s);
  const Vec l0 = load(s + n - 4 * kVec), l1 = load(s + n - 3 * kVec), l2 = load(s + n - 2 * kVec),
            l3 = load(s + n - kVec);
  const size_t head = (kVec - (reinterpret_cast<uintptr_t>(d) & (kVec - 1))) & (kVec - 1);
  store_unaligned(d, first);
  size_t i = head;
  for (; i + 4 * kVec <= n; i += 4 * kVec) {
    const Vec a = load(s + i), b = load(s + i + kVec), c = load(s + i + 2 * kVec), e = load(s + i + 3 * kVec);
    if constexpr (kStream) {
      store_stream(d + i, a);
      store_stream(d + i + kVec, b);
      store_stream(d + i + 2 * kVec, c);
      store_stream(d + i + 3 * kVec, e);
    } else {
      store_aligned(d + i, a);
      store_aligned(d + i + kVec, b);
      store_aligned(d + i + 2 * kVec, c);
      store_aligned(d + i + 3 * kVec, e);
    }
  }
  store_unaligned(d + n - 4 * kVec, l0);
  store_unaligned(d + n - 3 * kVec, l1);
  store_unaligned(d + n - 2 * kVec, l2);
  store_unaligned(d + n - kVec, l3);
}
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n, bool stream) {
#if defined(__AVX512F__) || defined(__AVX2__)
  if (n >= kCopyLoopMinBytes) {
    if (stream) {
      copy_vec<true>(static_cast<char*>(dst), static_cast<const char*>(src), n);
    } else {
      copy_vec<false>(static_cast<char*>(dst), static_cast<const char*>(src), n);
    }
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, n);
}

void copy_in_pieces(void* dst, const void* src, size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (size_t o = 0; o < n; o += kOwnCopyPieceBytes) std::memcpy(d + o, s + o, std::min(kOwnCopyPieceBytes, n - o));
}

CopyInPolicy CopyInPolicy::fixed(bool stream) {
  CopyInPolicy p(0, 0);
  p.fixed_ = true;
  p.stream_ = stream;
  return p;
}

CopyInPolicy::Plan CopyInPolicy::plan(size_t n) {
  Plan p;
  p.stream = stream_ && (fixed_ || n >= kProbeMinBytes);
  if (!fixed_) {
    if (!stream_ && n >= kMeasureMinBytes) {
      p.timed_bytes = n;
    } else if (n >= kProbeMinBytes && ++since_probe_ >= kProbeEvery) {
      since_probe_ = 0;
      p.timed_bytes = std::min(n, kProbeBytes);
    }
  }
  if (n >= kCopyLoopMinBytes) ++(p.stream ? streamed_ : ordinary_);  // smaller ones are memcpy either way
  return p;
}

void CopyInPolicy::observe(size_t bytes, double seconds) {
  if (fixed_ || bytes == 0) return;
  const double rate = double(bytes) / std::max(seconds, 1e-9);
  if (!stream_) {
    slow_in_a_row_ = rate < to_stream_ ? slow_in_a_row_ + 1 : 0;
    if (slow_in_a_row_ >= 2) {
      stream_ = true;
      slow_in_a_row_ = 0;
      since_probe_ = 0;
      ++switches_;
    }
  } else if (rate >= to_ordinary_) {
    stream_ = false;
    ++switches_;
  }
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// This core's copy rate for data in its own cache: 256 KB private to private, best of 8 after a warm-up.
double in_cache_copy_rate() {
  constexpr size_t kBytes = 256 * 1024;
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  double best = 1e30;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    copy_bytes(dst.data(), src.data(), kBytes, false);
    if (i >= 2) best = std::min(best, seconds_since(t0));
  }
  return double(kBytes) / best;
}

CopyInPolicy make_policy() {
  if (auto fixed = env_flag("MESHTRAIN_SHM_STREAM")) return CopyInPolicy::fixed(*fixed);
  const double r = in_cache_copy_rate();
  return CopyInPolicy(r / 6, r / 4);
}

}  // namespace

CopyInPolicy& copy_in_policy() {
  thread_local CopyInPolicy policy = make_policy();
  return policy;
}

void copy_in(void* shared_dst, const void* src, size_t n, CopyInPolicy& policy) {
  const CopyInPolicy::Plan p = policy.plan(n);
  char* d = static_cast<char*>(shared_dst);
  const char* s = static_cast<const char*>(src);
  if (p.timed_bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    copy_bytes(d, s, p.timed_bytes, false);
    policy.observe(p.timed_bytes, seconds_since(t0));
  }
  if (n > p.timed_bytes) copy_bytes(d + p.timed_bytes, s + p.timed_bytes, n - p.timed_bytes, p.stream);
}

void stream_fence() {
#if defined(__AVX2__) || defined(__AVX512F__)
  _mm_sfence();
#endif
}

}  // namespace mt::comm
