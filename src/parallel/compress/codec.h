// Gradient codecs for communication-efficient data parallelism: what one rank sends for one tensor (a flat
// vector x of n floats), as a byte payload whose size depends only on (spec, n), so that every rank's payload
// has the same size and one all_gather moves them all.
//
// Legend: n elements, k kept elements, b bits per element, s quantization levels, d bucket size.
//
//   topk:R     the k = max(1, ceil(R n)) entries of largest |x| (ties: the lower index), as (uint32 index,
//              float value) pairs: 8k bytes. Biased: used with error feedback.
//   randk:R    k entries at indices drawn uniformly without replacement (a seeded draw, different per rank,
//              step and tensor), same payload. Unscaled (biased): used with error feedback.
//   qsgd:B     QSGD (Alistarh et al. 2017) per bucket of d = 512: the bucket's scale m = max |x| (float; the
//              L-infinity norm, as practical QSGD implementations use), then per element its sign and a level
//              l in 0..s, s = 2^(B-1) - 1, randomized so that E[decoded] = x: l = floor(s |x| / m + u), u uniform
//              in [0, 1). ceil(n/d) * 4 + ceil(n B / 8) bytes. Unbiased; variance <= d m^2 / (4 s^2) per
//              bucket (each element rounds between levels m / s apart). Why not the paper's L2 norm: in a
//              bucket of 512 similar entries every |x| / |x|_2 is about 0.04, so at 4 bits nearly every entry
//              rounds between 0 and 1/7 of the norm, a variance of about 2 |x|^2 per bucket; with the maximum
//              the levels span the values actually present (about 0.05 |x|^2 for Gaussian entries). Measured
//              on the character-level GPT of bench/comm_efficiency.py, qsgd:4's final loss gap to exact DP went
//              from 5.1% (L2) to 0.8% (max).
//   nuqsgd:B   NUQSGD (Ramezani-Kebrya et al. 2021): as qsgd, but the levels are 0, 2^-(s-1), ..., 1/2, 1
//              (times the scale m), denser near zero; |x| / m is rounded to one of its two neighbouring
//              levels with the probabilities that make it unbiased. Same payload.
//   sign       1-bit sign per element plus one float scale = mean |x| (as in EF-signSGD, Karimireddy et al.
//              2019): 4 + ceil(n / 8) bytes. Biased: used with error feedback.
//
// Randomness comes from the counter-based generator keyed by (seed, step, rank, tensor), so runs repeat.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/compress/spec.h"

namespace mt::compress {

constexpr size_t kQuantBucket = 512;  // d

// Bytes of the payload of a tensor of n elements.
size_t payload_bytes(const CompressSpec& spec, size_t n);
// Elements kept by topk / randk.
size_t kept(const CompressSpec& spec, size_t n);

// Identifies the random draws of one encode: (seed, step, rank, tensor index).
struct DrawKey {
  uint64_t seed = 0;
  int64_t step = 0;
  int rank = 0;
  int tensor = 0;
};

// Writes x's payload (payload_bytes(spec, n) bytes) to out.
void encode(const CompressSpec& spec, const float* x, size_t n, const DrawKey& key, uint8_t* out);
// y[i] += decoded payload (y has n elements).
void decode_add(const CompressSpec& spec, const uint8_t* payload, size_t n, float* y);
// The indices a topk / randk payload carries, in payload order (DGC's momentum factor masking).
std::vector<uint32_t> sparse_indices(const CompressSpec& spec, const uint8_t* payload, size_t n);

// b-bit codes, little-endian within the byte stream (code i occupies bits [i b, (i + 1) b)).
void pack_bits(const uint32_t* codes, size_t n, int bits, uint8_t* out);
void unpack_bits(const uint8_t* in, size_t n, int bits, uint32_t* codes);

}  // namespace mt::compress
