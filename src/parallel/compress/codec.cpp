#include "parallel/compress/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace mt::compress {

namespace {

size_t bytes_for_bits(size_t n, int bits) { return (n * (size_t)bits + 7) / 8; }
size_t buckets(size_t n) { return (n + kQuantBucket - 1) / kQuantBucket; }
int levels(int bits) { return (1 << (bits - 1)) - 1; }  // s: nonzero levels

CounterRng rng_of(const DrawKey& k, const char* what) {
  return CounterRng(k.seed, str(what, "/step", k.step, "/rank", k.rank, "/tensor", k.tensor));
}

// NUQSGD's levels as fractions of the scale: 0, 2^-(s-1), ..., 1/2, 1 (index 0..s).
double nuq_level(int index, int s) { return index == 0 ? 0.0 : std::ldexp(1.0, index - s); }

void encode_sparse(const float* x, size_t n, const std::vector<uint32_t>& idx, uint8_t* out) {
  for (size_t j = 0; j < idx.size(); j++) {
    std::memcpy(out + 8 * j, &idx[j], 4);
    std::memcpy(out + 8 * j + 4, &x[idx[j]], 4);
  }
  (void)n;
}

void encode_quant(const CompressSpec& spec, const float* x, size_t n, const DrawKey& key, uint8_t* out) {
  const int s = levels(spec.bits);
  const bool uniform = spec.method == Method::qsgd;
  const CounterRng rng = rng_of(key, uniform ? "qsgd" : "nuqsgd");
  const size_t nb = buckets(n);
  const uint32_t sign_bit = 1u << (spec.bits - 1);
  std::vector<double> nuq(s + 1);
  for (int l = 0; l <= s; l++) nuq[l] = nuq_level(l, s);
  std::vector<uint32_t> codes(n);
  for (size_t b = 0; b < nb; b++) {
    const size_t lo = b * kQuantBucket, hi = std::min(n, lo + kQuantBucket);
    float scale = 0.0f;  // max |x|: the L-infinity norm of the bucket
    for (size_t i = lo; i < hi; i++) scale = std::max(scale, std::fabs(x[i]));
    std::memcpy(out + 4 * b, &scale, 4);
    const double inv = scale > 0 ? 1.0 / (double)scale : 0.0;
    for (size_t i = lo; i < hi; i++) {
      const double r = std::min(1.0, std::fabs((double)x[i]) * inv);  // in [0, 1]
      const double u = rng.uniform(i);
      int level;
      if (uniform) {
        level = std::min(s, (int)(r * s + u));  // floor: r s + u >= 0
      } else if (r <= 0.0) {
        level = 0;
      } else {
        // The neighbouring levels a <= r < c: a = 2^(j-s) for j = s + floor(log2 r) (0 below the lowest
        // non-zero level), c the next one; up with probability (r - a) / (c - a).
        int e;
        std::frexp(r, &e);  // r = m 2^e, m in [0.5, 1): 2^(e-1) <= r < 2^e
        const int j = std::max(0, e - 1 + s);
        if (j >= s) {
          level = s;
        } else {
          level = u < (r - nuq[j]) / (nuq[j + 1] - nuq[j]) ? j + 1 : j;
        }
      }
      codes[i] = (uint32_t)level | (x[i] < 0 ? sign_bit : 0u);
    }
  }
  pack_bits(codes.data(), n, spec.bits, out + 4 * nb);
}

void decode_quant(const CompressSpec& spec, const uint8_t* in, size_t n, float* y) {
  const int s = levels(spec.bits);
  const bool uniform = spec.method == Method::qsgd;
  const size_t nb = buckets(n);
  std::vector<uint32_t> codes(n);
  unpack_bits(in + 4 * nb, n, spec.bits, codes.data());
  const uint32_t sign_bit = 1u << (spec.bits - 1);
  std::vector<double> mag(s + 1);
  for (int l = 0; l <= s; l++) mag[l] = uniform ? (double)l / s : nuq_level(l, s);
  std::vector<float> value(2 * (size_t)sign_bit);  // per code (sign bit and level): the decoded value
  for (size_t b = 0; b < nb; b++) {
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    for (uint32_t l = 0; l <= (uint32_t)s; l++) {
      const float v = (float)(scale * mag[l]);
      value[l] = v;
      value[l | sign_bit] = -v;
    }
    const size_t lo = b * kQuantBucket, hi = std::min(n, lo + kQuantBucket);
    for (size_t i = lo; i < hi; i++) y[i] += value[codes[i]];
  }
}

}  // namespace

size_t kept(const CompressSpec& spec, size_t n) {
  return std::min(n, std::max<size_t>(1, (size_t)std::ceil(spec.ratio * (double)n - 1e-9)));
}

size_t payload_bytes(const CompressSpec& spec, size_t n) {
  switch (spec.method) {
    case Method::none: return 4 * n;
    case Method::topk:
    case Method::randk: return 8 * kept(spec, n);
    case Method::qsgd:
    case Method::nuqsgd: return 4 * buckets(n) + bytes_for_bits(n, spec.bits);
    case Method::sign: return 4 + bytes_for_bits(n, 1);
    case Method::powersgd: break;
  }
  MT_ASSERT(false, "payload_bytes: ", spec.str(), " has no per-tensor payload");
  return 0;
}

void encode(const CompressSpec& spec, const float* x, size_t n, const DrawKey& key, uint8_t* out) {
  switch (spec.method) {
    case Method::none:
      std::memcpy(out, x, 4 * n);
      return;
    case Method::topk: {
      const size_t k = kept(spec, n);
      std::vector<uint32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0u);
      auto larger = [&](uint32_t a, uint32_t b) {
        const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
        return fa > fb || (fa == fb && a < b);
      };
      std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), larger);
      idx.resize(k);
      std::sort(idx.begin(), idx.end());
      encode_sparse(x, n, idx, out);
      return;
    }
    case Method::randk: {
      // Floyd's algorithm: k distinct indices, each k-subset equally likely.
      const size_t k = kept(spec, n);
      const CounterRng rng = rng_of(key, "randk");
      std::vector<uint32_t> idx;
      std::vector<bool> taken(n, false);
      for (size_t j = n - k; j < n; j++) {
        uint32_t t = (uint32_t)(rng.bits(j) % (j + 1));
        if (taken[t]) t = (uint32_t)j;
        taken[t] = true;
        idx.push_back(t);
      }
      std::sort(idx.begin(), idx.end());
      encode_sparse(x, n, idx, out);
      return;
    }
    case Method::qsgd:
    case Method::nuqsgd:
      encode_quant(spec, x, n, key, out);
      return;
    case Method::sign: {
      double sum = 0;
      for (size_t i = 0; i < n; i++) sum += std::fabs((double)x[i]);
      const float scale = n ? (float)(sum / (double)n) : 0.0f;
      std::memcpy(out, &scale, 4);
      std::vector<uint32_t> codes(n);
      for (size_t i = 0; i < n; i++) codes[i] = x[i] < 0 ? 1u : 0u;
      pack_bits(codes.data(), n, 1, out + 4);
      return;
    }
    case Method::powersgd: break;
  }
  MT_ASSERT(false, "encode: ", spec.str(), " is not a per-tensor codec");
}

void decode_add(const CompressSpec& spec, const uint8_t* in, size_t n, float* y) {
  switch (spec.method) {
    case Method::none:
      for (size_t i = 0; i < n; i++) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        y[i] += v;
      }
      return;
    case Method::topk:
    case Method::randk: {
      const size_t k = kept(spec, n);
      for (size_t j = 0; j < k; j++) {
        uint32_t i;
        float v;
        std::memcpy(&i, in + 8 * j, 4);
        std::memcpy(&v, in + 8 * j + 4, 4);
        MT_REQUIRE(Error, i < n, "sparse payload index ", i, " out of range ", n);
        y[i] += v;
      }
      return;
    }
    case Method::qsgd:
    case Method::nuqsgd:
      decode_quant(spec, in, n, y);
      return;
    case Method::sign: {
      float scale;
      std::memcpy(&scale, in, 4);
      std::vector<uint32_t> codes(n);
      unpack_bits(in + 4, n, 1, codes.data());
      for (size_t i = 0; i < n; i++) y[i] += codes[i] ? -scale : scale;
      return;
    }
    case Method::powersgd: break;
  }
  MT_ASSERT(false, "decode_add: ", spec.str(), " is not a per-tensor codec");
}

std::vector<uint32_t> sparse_indices(const CompressSpec& spec, const uint8_t* in, size_t n) {
  MT_ASSERT(spec.method == Method::topk || spec.method == Method::randk, "sparse_indices: ", spec.str(),
            " is not a sparse codec");
  const size_t k = kept(spec, n);
  std::vector<uint32_t> idx(k);
  for (size_t j = 0; j < k; j++) {
    std::memcpy(&idx[j], in + 8 * j, 4);
    MT_REQUIRE(Error, idx[j] < n, "sparse payload index ", idx[j], " out of range ", n);
  }
  return idx;
}

void pack_bits(const uint32_t* codes, size_t n, int bits, uint8_t* out) {
  std::memset(out, 0, bytes_for_bits(n, bits));
  for (size_t i = 0; i < n; i++) {
    const size_t bit = i * (size_t)bits;
    const uint64_t v = (uint64_t)(codes[i] & ((1u << bits) - 1)) << (bit % 8);
    for (size_t b = 0; b * 8 < (bit % 8) + (size_t)bits; b++) out[bit / 8 + b] |= (uint8_t)(v >> (8 * b));
  }
}

void unpack_bits(const uint8_t* in, size_t n, int bits, uint32_t* codes) {
  for (size_t i = 0; i < n; i++) {
    const size_t bit = i * (size_t)bits;
    uint64_t v = 0;
    for (size_t b = 0; b * 8 < (bit % 8) + (size_t)bits; b++) v |= (uint64_t)in[bit / 8 + b] << (8 * b);
    codes[i] = (uint32_t)((v >> (bit % 8)) & ((1u << bits) - 1));
  }
}

}  // namespace mt::compress
