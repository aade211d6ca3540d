// Counter-based random numbers: every value is a pure function of (seed, stream name, element index).
// This is what lets a shard of a tensor initialize exactly its own part of the full tensor without
// drawing the rest (DESIGN.md, central invariant), and makes initialization independent of layout,
// thread count and the order in which tensors are created.
//
// The mixer is SplitMix64's finalizer (Steele et al., 2014), applied to key + index * golden ratio; the
// key mixes the seed with a 64-bit FNV-1a hash of the name. Normal draws use Box-Muller on the two 32-bit
// halves of one 64-bit output, one normal per index.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace mt {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

class CounterRng {
 public:
  CounterRng(uint64_t seed, std::string_view stream) : key_(mix64(mix64(seed) ^ fnv1a64(stream))) {}

  uint64_t bits(uint64_t index) const { return mix64(key_ + (index + 1) * 0x9e3779b97f4a7c15ULL); }

  // Uniform in [0, 1).
  double uniform(uint64_t index) const { return double(bits(index) >> 11) * 0x1.0p-53; }

  // Standard normal.
  double normal(uint64_t index) const {
    uint64_t b = bits(index);
    double u1 = (double(b >> 32) + 0.5) * 0x1.0p-32;  // (0, 1): log is finite
    double u2 = double(b & 0xffffffffULL) * 0x1.0p-32;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
};

}  // namespace mt
