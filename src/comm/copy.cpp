#include "comm/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mt::comm {

void copy_bytes(void* dst, const void* src, size_t n, bool stream) {
#if defined(__AVX2__)
  if (stream && n >= 1024) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
      __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
      __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
      __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
    }
    std::memcpy(d + i, s + i, n - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, n);
}

void stream_fence() {
#if defined(__AVX2__)
  _mm_sfence();
#endif
}

}  // namespace mt::comm
