// bf16 conversion loops (bf16.h). The loops are plain: GCC vectorizes bf16_from_f32's integer operations
// (vpaddd, vpsrld, a compare and a blend per 16 values), which keeps denormals, unlike vcvtneps2bf16
// (that instruction flushes float32 denormal inputs to zero, so it would not be round to nearest even).
#include "tensor/bf16.h"

#include <vector>

#include <omp.h>

#include <cmath>
#include <limits>

namespace mt {

namespace {

// Below this many elements a pack runs on the calling thread (a thread team costs a few microseconds).
constexpr size_t kParallelPack = size_t{1} << 16;

bool pack_in_parallel(int rows, int cols) {
  return !omp_in_parallel() && omp_get_max_threads() > 1 && (size_t)rows * cols >= kParallelPack;
}

}  // namespace

void to_bf16(const float* __restrict src, uint16_t* __restrict dst, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = bf16_from_f32(src[i]);
}

void round_to_bf16(const float* src, float* dst, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
}

void pack_bf16(const float* src, int rows, int cols, int ld, uint16_t* dst) {
#pragma omp parallel for schedule(static) if (pack_in_parallel(rows, cols))
  for (int r = 0; r < rows; r++) to_bf16(src + (size_t)r * ld, dst + (size_t)r * cols, cols);
}

void pack_rounded(const float* src, int rows, int cols, int ld, float* dst) {
#pragma omp parallel for schedule(static) if (pack_in_parallel(rows, cols))
  for (int r = 0; r < rows; r++) round_to_bf16(src + (size_t)r * ld, dst + (size_t)r * cols, cols);
}

const uint16_t* packed_bf16_scratch(int slot, const float* src, int rows, int cols, int ld) {
  thread_local std::vector<uint16_t> buf[4];
  std::vector<uint16_t>& b = buf[slot];
  if (b.size() < (size_t)rows * cols) b.resize((size_t)rows * cols);
  pack_bf16(src, rows, cols, ld, b.data());
  return b.data();
}

uint16_t bf16_from_f32_reference(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  // lo: f truncated to bf16 (towards zero); hi: the next bf16 away from zero. Above the largest finite bf16
  // hi is inf, whose distance counts as that of 2^128 (the value the exponent would have if it had room).
  const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
  const double x = std::fabs((double)f), vlo = std::fabs((double)f32_from_bf16(lo));
  const double vhi = (hi & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128) : std::fabs((double)f32_from_bf16(hi));
  const double dlo = x - vlo, dhi = vhi - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;  // a tie: the even mantissa
}

}  // namespace mt
