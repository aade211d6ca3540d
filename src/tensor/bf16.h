// bfloat16: the top half of a float32 (sign, 8 exponent bits, 7 mantissa bits). Conversion from float32
// rounds to nearest, ties to even, like PyTorch's c10::BFloat16 and the wire format of comm/types.h:
// denormals round like any other value (no flush to zero), values above the largest finite bf16 by half
// an ulp or more become inf, a NaN stays a quiet NaN of the same sign. The product of two bf16 values is
// exact in float32 (8 + 8 significant bits), which is what makes mixed-precision products reproducible:
// "float32 products of rounded inputs" (blas.h, Precision::bf16).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace mt {

// One value; written with integer operations only, so loops over it vectorize (AVX-512: 16 per instruction).
inline uint16_t bf16_from_f32(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);
}
inline float f32_from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
// f rounded to the nearest bf16 value, kept as float32.
inline float bf16_round(float f) { return f32_from_bf16(bf16_from_f32(f)); }

// dst[i] = bf16(src[i]) for i < n.
void to_bf16(const float* src, uint16_t* dst, size_t n);
// dst[i] = bf16_round(src[i]) (dst may equal src).
void round_to_bf16(const float* src, float* dst, size_t n);

// The rows x cols matrix stored at src with row stride ld, packed contiguous (row stride cols) into dst:
// as bf16, or rounded and kept in float32 (the emulated products' inputs). Threads over rows when called
// outside a parallel region and the matrix is large. Cost: one read of the matrix, one write of the copy.
void pack_bf16(const float* src, int rows, int cols, int ld, uint16_t* dst);
void pack_rounded(const float* src, int rows, int cols, int ld, float* dst);
// pack_bf16 into this thread's scratch copy number slot (grown, never shrunk); valid until the slot's next use on
// the thread. Slots 0 and 1: an operand a caller rounds once and hands to several products (gemm_16, gemm_a16);
// slots 2 and 3: the GEMM backend's own copies of A and B inside one product.
const uint16_t* packed_bf16_scratch(int slot, const float* src, int rows, int cols, int ld);

// The same rounding written from the definition, for tests: the two bf16 neighbours of f (truncation and the
// next value away from zero) compared by their distance to f in double precision, ties to the even one.
uint16_t bf16_from_f32_reference(float f);

}  // namespace mt
