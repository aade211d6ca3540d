#include "comm/copy.h"

#include <cstdint>
#include <cstring>

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

void stream_fence() {
#if defined(__AVX2__) || defined(__AVX512F__)
  _mm_sfence();
#endif
}

}  // namespace mt::comm
