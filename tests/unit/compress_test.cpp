// Gradient codecs (parallel/compress/codec.h) and the --compress parser (spec.h) against references written out
// in the test from the header's stated semantics: which entries topk keeps, randk's draw, the distribution of
// QSGD / NUQSGD's stochastic rounding (unbiased, with the variance of two-level rounding), the bit packing
// layout, sign's scale, and the payload sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/compress/codec.h"
#include "parallel/compress/spec.h"

namespace {

using mt::compress::CompressSpec;
using mt::compress::DrawKey;
using mt::compress::Method;

std::vector<float> normal_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(gen);
  return x;
}

// Values on a coarse grid (multiples of 1/4 in [-2, 2]): many entries share |x|, so tie-breaking matters.
std::vector<float> tied_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> x(n);
  for (float& v : x) v = 0.25f * (float)d(gen);
  return x;
}

std::vector<float> decoded(const CompressSpec& spec, const std::vector<uint8_t>& payload, size_t n) {
  std::vector<float> y(n, 0.0f);
  mt::compress::decode_add(spec, payload.data(), n, y.data());
  return y;
}

std::vector<uint8_t> encoded(const CompressSpec& spec, const std::vector<float>& x, const DrawKey& key) {
  std::vector<uint8_t> out(mt::compress::payload_bytes(spec, x.size()));
  mt::compress::encode(spec, x.data(), x.size(), key, out.data());
  return out;
}

CompressSpec make(Method m, double ratio = 0, int bits = 0, int rank = 0) {
  CompressSpec s;
  s.method = m;
  s.ratio = ratio;
  s.bits = bits;
  s.rank = rank;
  return s;
}

// k = max(1, ceil(num / den * n)) in integer arithmetic, so no floating-point rounding of R n can move it.
size_t expected_kept(size_t num, size_t den, size_t n) { return std::max<size_t>(1, (num * n + den - 1) / den); }

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------------------------
// parse_compress_spec

TEST(CompressSpecParse, AcceptedFormsAndStrRoundTrip) {
  struct Case {
    std::string text;
    Method method;
    double ratio;
    int bits, rank;
  };
  const std::vector<Case> cases = {
      {"topk:0.01", Method::topk, 0.01, 0, 0},  {"topk:1", Method::topk, 1.0, 0, 0},
      {"randk:0.25", Method::randk, 0.25, 0, 0}, {"qsgd:2", Method::qsgd, 0, 2, 0},
      {"qsgd:8", Method::qsgd, 0, 8, 0},         {"nuqsgd:4", Method::nuqsgd, 0, 4, 0},
      {"powersgd:1", Method::powersgd, 0, 0, 1}, {"powersgd:4", Method::powersgd, 0, 0, 4},
      {"sign", Method::sign, 0, 0, 0},
  };
  for (const Case& c : cases) {
    const CompressSpec s = mt::compress::parse_compress_spec(c.text);
    EXPECT_EQ(s.method, c.method) << c.text;
    EXPECT_EQ(s.ratio, c.ratio) << c.text;
    EXPECT_EQ(s.bits, c.bits) << c.text;
    EXPECT_EQ(s.rank, c.rank) << c.text;
    EXPECT_TRUE(s.enabled()) << c.text;
    // str() spells the flag as written, and parsing that spelling gives the same spec back.
    EXPECT_EQ(s.str(), c.text);
    const CompressSpec again = mt::compress::parse_compress_spec(s.str());
    EXPECT_EQ(again.method, s.method) << c.text;
    EXPECT_EQ(again.ratio, s.ratio) << c.text;
    EXPECT_EQ(again.bits, s.bits) << c.text;
    EXPECT_EQ(again.rank, s.rank) << c.text;
  }
  // Other spellings of the same number parse to the same value and print canonically.
  EXPECT_EQ(mt::compress::parse_compress_spec("topk:1e-2").ratio, 0.01);
  EXPECT_EQ(mt::compress::parse_compress_spec("topk:1e-2").str(), "topk:0.01");
  EXPECT_EQ(mt::compress::parse_compress_spec("qsgd:4.0").bits, 4);
  // No compression: empty or "none".
  EXPECT_FALSE(mt::compress::parse_compress_spec("").enabled());
  EXPECT_FALSE(mt::compress::parse_compress_spec("none").enabled());
}

TEST(CompressSpecParse, BadFormsThrowInputErrorNamingTheFlag) {
  for (const std::string bad : {"topk:0", "topk:1.5", "topk:-0.1", "randk:0", "randk:2", "qsgd:1", "qsgd:9",
                                "qsgd:4.5", "nuqsgd:1", "nuqsgd:9", "powersgd:0", "powersgd:1.5", "powersgd:-2",
                                "foo", "foo:1", "topk", "qsgd", "powersgd", "topk:", "topk:abc", "topk:0.1x",
                                "topk:nan", "topk:inf", "sign:1", "sign:"}) {
    try {
      mt::compress::parse_compress_spec(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const mt::InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--compress"), std::string::npos) << "'" << bad << "': " << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << "the message should quote the value '" << bad << "': " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "'" << bad << "' threw something other than mt::InputError: " << e.what();
    }
  }
}

TEST(CompressSpecParse, ErrorFeedbackAndLightSettings) {
  using mt::compress::parse_compress_spec;
  // Biased codecs use error feedback, unbiased ones do not.
  EXPECT_TRUE(parse_compress_spec("topk:0.1").error_feedback());
  EXPECT_TRUE(parse_compress_spec("randk:0.1").error_feedback());
  EXPECT_TRUE(parse_compress_spec("sign").error_feedback());
  EXPECT_TRUE(parse_compress_spec("powersgd:2").error_feedback());
  EXPECT_FALSE(parse_compress_spec("qsgd:4").error_feedback());
  EXPECT_FALSE(parse_compress_spec("nuqsgd:4").error_feedback());
  // light(): 4x the entries capped at all, 4 more bits capped at 8, 4x the rank, sign -> no compression.
  EXPECT_EQ(parse_compress_spec("topk:0.1").light().ratio, 0.4);
  EXPECT_EQ(parse_compress_spec("randk:0.5").light().ratio, 1.0);
  EXPECT_EQ(parse_compress_spec("qsgd:2").light().bits, 6);
  EXPECT_EQ(parse_compress_spec("nuqsgd:6").light().bits, 8);
  EXPECT_EQ(parse_compress_spec("powersgd:2").light().rank, 8);
  EXPECT_EQ(parse_compress_spec("powersgd:2").light().method, Method::powersgd);
  EXPECT_EQ(parse_compress_spec("sign").light().method, Method::none);
}

// ---------------------------------------------------------------------------------------------------------------
// topk

TEST(CompressTopk, KeepsTheLargestMagnitudesWithLowerIndexOnTies) {
  // Ratios as exact fractions num/den: 0.1 * 30 and 0.3 * 10 are just above 3 in binary floating point, and k
  // must still be 3.
  const std::vector<std::pair<size_t, size_t>> ratios = {{1, 10}, {1, 4}, {3, 10}, {1, 100}, {1, 1}};
  const std::vector<size_t> sizes = {1, 2, 7, 10, 30, 100, 513, 1031};
  uint32_t seed = 1;
  for (auto [num, den] : ratios) {
    const CompressSpec spec = make(Method::topk, (double)num / (double)den);
    for (size_t n : sizes) {
      for (int tied = 0; tied < 2; tied++) {
        const std::vector<float> x = tied ? tied_vector(n, seed++) : normal_vector(n, seed++);
        const size_t k = expected_kept(num, den, n);
        ASSERT_EQ(mt::compress::kept(spec, n), k) << spec.str() << " n=" << n;
        ASSERT_EQ(mt::compress::payload_bytes(spec, n), 8 * k) << spec.str() << " n=" << n;
        // Reference: order by |x| descending, then index ascending; the first k are kept.
        std::vector<size_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
        std::vector<float> want(n, 0.0f);
        for (size_t j = 0; j < k; j++) want[order[j]] = x[order[j]];
        // decode_add adds to what is there: start from a known non-zero y.
        std::vector<float> y0(n);
        for (size_t i = 0; i < n; i++) y0[i] = 0.5f * (float)(i % 3);
        std::vector<float> y = y0;
        const std::vector<uint8_t> payload = encoded(spec, x, DrawKey{});
        mt::compress::decode_add(spec, payload.data(), n, y.data());
        for (size_t i = 0; i < n; i++)
          ASSERT_EQ(y[i], y0[i] + want[i]) << spec.str() << " n=" << n << " tied=" << tied << " element " << i;
        // The payload is k (uint32 index, float value) pairs naming exactly the kept entries.
        std::set<uint32_t> idx;
        for (size_t j = 0; j < k; j++) {
          uint32_t i;
          float v;
          std::memcpy(&i, payload.data() + 8 * j, 4);
          std::memcpy(&v, payload.data() + 8 * j + 4, 4);
          ASSERT_LT(i, n);
          EXPECT_EQ(v, x[i]);
          idx.insert(i);
        }
        std::set<uint32_t> want_idx;
        for (size_t j = 0; j < k; j++) want_idx.insert((uint32_t)order[j]);
        EXPECT_EQ(idx, want_idx) << spec.str() << " n=" << n << " tied=" << tied;
      }
    }
  }
}

TEST(CompressTopk, AllEqualMagnitudesKeepTheFirstK) {
  const size_t n = 50;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = (i % 2) ? -1.0f : 1.0f;
  const CompressSpec spec = make(Method::topk, 0.2);
  const std::vector<float> y = decoded(spec, encoded(spec, x, DrawKey{}), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(y[i], i < 10 ? x[i] : 0.0f) << "element " << i;
}

// ---------------------------------------------------------------------------------------------------------------
// randk

std::vector<uint32_t> sparse_indices(const std::vector<uint8_t>& payload, size_t k) {
  std::vector<uint32_t> idx(k);
  for (size_t j = 0; j < k; j++) std::memcpy(&idx[j], payload.data() + 8 * j, 4);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(CompressRandk, KeepsKDistinctEntriesWithExactValues) {
  const std::vector<std::pair<size_t, size_t>> ratios = {{1, 10}, {1, 4}, {3, 10}, {1, 1}};
  uint32_t seed = 100;
  for (auto [num, den] : ratios) {
    const CompressSpec spec = make(Method::randk, (double)num / (double)den);
    for (size_t n : {size_t(1), size_t(7), size_t(30), size_t(513), size_t(1000)}) {
      std::vector<float> x = normal_vector(n, seed++);
      for (float& v : x)
        if (v == 0.0f) v = 1.0f;  // no zero entries: a kept entry always shows in the decoded vector
      const size_t k = expected_kept(num, den, n);
      ASSERT_EQ(mt::compress::payload_bytes(spec, n), 8 * k);
      for (int64_t step = 0; step < 5; step++) {
        const std::vector<uint8_t> payload = encoded(spec, x, DrawKey{7, step, 1, 2});
        const std::vector<uint32_t> idx = sparse_indices(payload, k);
        ASSERT_EQ(std::set<uint32_t>(idx.begin(), idx.end()).size(), k) << spec.str() << " n=" << n << ": repeats";
        ASSERT_LT(idx.back(), n);
        const std::vector<float> y = decoded(spec, payload, n);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++) {
          const bool kept = std::binary_search(idx.begin(), idx.end(), (uint32_t)i);
          EXPECT_EQ(y[i], kept ? x[i] : 0.0f) << spec.str() << " n=" << n << " element " << i;
          nonzero += y[i] != 0.0f;
        }
        EXPECT_EQ(nonzero, k);
      }
    }
  }
}

TEST(CompressRandk, DrawDependsOnEveryPartOfTheKeyAndRepeats) {
  const size_t n = 1000;
  const CompressSpec spec = make(Method::randk, 0.1);
  const std::vector<float> x = normal_vector(n, 5);
  const DrawKey base{42, 3, 1, 2};
  const std::vector<uint8_t> ref = encoded(spec, x, base);
  // The same key draws the same indices, byte for byte.
  EXPECT_EQ(encoded(spec, x, base), ref);
  const std::vector<uint32_t> ref_idx = sparse_indices(ref, 100);
  std::vector<DrawKey> others = {{43, 3, 1, 2}, {42, 4, 1, 2}, {42, 3, 0, 2}, {42, 3, 1, 3}};
  for (const DrawKey& k : others) {
    const std::vector<uint32_t> idx = sparse_indices(encoded(spec, x, k), 100);
    // Two independent uniform 100-subsets of 1000 share about 10 indices; sharing all would be a repeated draw.
    std::vector<uint32_t> common;
    std::set_intersection(idx.begin(), idx.end(), ref_idx.begin(), ref_idx.end(), std::back_inserter(common));
    EXPECT_LT(common.size(), 40u) << "key (seed " << k.seed << ", step " << k.step << ", rank " << k.rank
                                  << ", tensor " << k.tensor << ") draws nearly the same indices as the base key";
  }
}

TEST(CompressRandk, EveryIndexIsEquallyLikely) {
  // Over D draws each index is kept with probability k / n: counts ~ Binomial(D, k/n). Checked to 6 sigma.
  const size_t n = 20, k = 5, D = 4000;
  const CompressSpec spec = make(Method::randk, 0.25);
  const std::vector<float> x = normal_vector(n, 9);
  std::vector<int> count(n, 0);
  for (size_t d = 0; d < D; d++)
    for (uint32_t i : sparse_indices(encoded(spec, x, DrawKey{1, (int64_t)d, 0, 0}), k)) count[i]++;
  const double p = (double)k / n, mean = D * p, sd = std::sqrt(D * p * (1 - p));
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(count[i], mean, 6 * sd) << "index " << i;
}

// ---------------------------------------------------------------------------------------------------------------
// qsgd, nuqsgd

// The quantization levels as fractions of the bucket scale (max |x|), written out from codec.h: s = 2^(B-1) - 1 and
// QSGD: l / s (l = 0..s); NUQSGD: 0, 2^-(s-1), ..., 1/2, 1.
std::vector<double> level_table(Method m, int bits) {
  const int s = (1 << (bits - 1)) - 1;
  std::vector<double> lv(s + 1);
  for (int l = 0; l <= s; l++) lv[l] = m == Method::qsgd ? (double)l / s : (l == 0 ? 0.0 : std::pow(2.0, l - s));
  return lv;
}

struct Bucketed {
  std::vector<float> norm;    // per bucket: the scale max |x| (what the payload carries)
  std::vector<double> lo, hi; // per element: the neighbouring levels of |x| / scale, times the scale
};

Bucketed neighbours(Method m, int bits, const std::vector<float>& x) {
  const size_t n = x.size(), d = mt::compress::kQuantBucket;
  const std::vector<double> lv = level_table(m, bits);
  Bucketed b;
  b.lo.resize(n);
  b.hi.resize(n);
  for (size_t lo = 0; lo < n; lo += d) {
    const size_t hi = std::min(n, lo + d);
    float norm = 0.0f;
    for (size_t i = lo; i < hi; i++) norm = std::max(norm, std::fabs(x[i]));
    b.norm.push_back(norm);
    for (size_t i = lo; i < hi; i++) {
      const double r = norm > 0 ? std::min(1.0, std::fabs((double)x[i]) / norm) : 0.0;
      size_t j = std::upper_bound(lv.begin(), lv.end(), r) - lv.begin() - 1;  // lv[j] <= r
      const size_t j1 = std::min(j + 1, lv.size() - 1);
      b.lo[i] = lv[j] * norm;
      b.hi[i] = (r == lv[j] ? lv[j] : lv[j1]) * norm;
    }
  }
  return b;
}

// A test vector of 2 full buckets and a partial one, with a zero, a dominating entry and a whole bucket whose
// entries sit exactly on levels.
std::vector<float> quant_vector(size_t n, uint32_t seed) {
  std::vector<float> x = normal_vector(n, seed);
  x[3] = 0.0f;
  x[700] = 40.0f;   // dominates bucket 1: the rest of it is tiny relative to the norm
  x[1030] = -x[1030];
  return x;
}

class CompressQuant : public ::testing::TestWithParam<std::tuple<Method, int>> {};

TEST_P(CompressQuant, UnbiasedWithTwoLevelRoundingVariance) {
  const auto [method, bits] = GetParam();
  const CompressSpec spec = make(method, 0, bits);
  const size_t n = 1100, D = 2000, d = mt::compress::kQuantBucket;
  const int s = (1 << (bits - 1)) - 1;
  const std::vector<float> x = quant_vector(n, 11 + bits);
  const Bucketed nb = neighbours(method, bits, x);
  std::vector<double> sum(n, 0.0), sumsq(n, 0.0);
  std::vector<float> y(n);
  for (size_t draw = 0; draw < D; draw++) {
    const std::vector<uint8_t> payload = encoded(spec, x, DrawKey{3, (int64_t)draw, 0, 0});
    std::fill(y.begin(), y.end(), 0.0f);
    mt::compress::decode_add(spec, payload.data(), n, y.data());
    for (size_t i = 0; i < n; i++) {
      // Every decoded value is sign(x) times one of the two levels around |x| / norm, times the norm (to float
      // rounding of the product).
      const double a = std::fabs((double)y[i]), tol = 4e-7 * nb.norm[i / d];
      const bool is_lo = std::fabs(a - nb.lo[i]) <= tol, is_hi = std::fabs(a - nb.hi[i]) <= tol;
      if (!is_lo && !is_hi)
        FAIL() << spec.str() << " element " << i << " x=" << x[i] << " decoded " << y[i] << ", expected +-"
               << nb.lo[i] << " or +-" << nb.hi[i] << " (draw " << draw << ")";
      if (y[i] != 0.0f && (y[i] < 0) != (x[i] < 0))
        FAIL() << spec.str() << " element " << i << " x=" << x[i] << " decoded with the wrong sign: " << y[i];
      sum[i] += y[i];
      sumsq[i] += (double)y[i] * y[i];
    }
  }
  // Unbiased: rounding |x| between levels a <= |x| <= c up with probability (|x| - a) / (c - a) has mean |x| and
  // variance (|x| - a) (c - |x|). The mean of D draws is within 6 standard deviations of x per element (plus float
  // rounding of the decoded products), and the normalized squared errors sum to about the number of random
  // elements (a chi-square with that many degrees of freedom: checked to 6 of its standard deviations).
  double chi2 = 0;
  size_t dof = 0;
  std::vector<double> var_emp_bucket(nb.norm.size(), 0.0), var_exact_bucket(nb.norm.size(), 0.0),
      sq_bucket(nb.norm.size(), 0.0);
  for (size_t i = 0; i < n; i++) {
    const double ax = std::fabs((double)x[i]);
    const double var = std::max(0.0, (ax - nb.lo[i]) * (nb.hi[i] - ax));
    const double mean = sum[i] / D, err = mean - x[i];
    EXPECT_LE(std::fabs(err), 6 * std::sqrt(var / D) + 1e-6 * nb.norm[i / d])
        << spec.str() << " element " << i << " x=" << x[i] << " mean of " << D << " draws " << mean;
    if (var > 1e-10 * (double)nb.norm[i / d] * nb.norm[i / d]) {
      chi2 += err * err / (var / D);
      dof++;
    }
    var_emp_bucket[i / d] += sumsq[i] / D - mean * mean;
    var_exact_bucket[i / d] += var;
    sq_bucket[i / d] += (double)x[i] * x[i];
  }
  ASSERT_GT(dof, 100u);
  EXPECT_LE(chi2, dof + 6 * std::sqrt(2.0 * dof)) << spec.str() << ": mean errors too large for the variance";
  EXPECT_GE(chi2, dof - 6 * std::sqrt(2.0 * dof)) << spec.str() << ": mean errors too small (draws not independent?)";
  for (size_t b = 0; b < nb.norm.size(); b++) {
    // The empirical variance of the bucket is the two-level rounding variance (sampling error well below 15%)...
    EXPECT_NEAR(var_emp_bucket[b], var_exact_bucket[b], 0.15 * var_exact_bucket[b] + 1e-9 * sq_bucket[b])
        << spec.str() << " bucket " << b;
    // ...and for QSGD within codec.h's bound d m^2 / (4 s^2), m = max |x| of the bucket (d = 512; it holds for a
    // shorter last bucket too).
    if (method == Method::qsgd) {
      const double m = nb.norm[b], bound = (double)d * m * m / (4.0 * s * s);
      EXPECT_LE(var_emp_bucket[b], bound) << spec.str() << " bucket " << b;
    }
  }
}

TEST_P(CompressQuant, PayloadLayoutSizeAndZeros) {
  const auto [method, bits] = GetParam();
  const CompressSpec spec = make(method, 0, bits);
  const size_t d = mt::compress::kQuantBucket;
  ASSERT_EQ(d, 512u);
  for (size_t n : {size_t(1), size_t(7), size_t(511), size_t(512), size_t(513), size_t(1100), size_t(2048)}) {
    const size_t bytes = ceil_div(n, 512) * 4 + ceil_div(n * bits, 8);
    ASSERT_EQ(mt::compress::payload_bytes(spec, n), bytes) << spec.str() << " n=" << n;
    // The payload starts with each bucket's scale max |x| as a float.
    const std::vector<float> x = normal_vector(n, 77 + (uint32_t)n);
    const std::vector<uint8_t> payload = encoded(spec, x, DrawKey{1, 2, 3, 4});
    for (size_t b = 0; b * d < n; b++) {
      float m = 0.0f;
      for (size_t i = b * d; i < std::min(n, (b + 1) * d); i++) m = std::max(m, std::fabs(x[i]));
      float scale;
      std::memcpy(&scale, payload.data() + 4 * b, 4);
      EXPECT_EQ(scale, m) << spec.str() << " n=" << n << " bucket " << b;
    }
    // Same key, same bytes; another step, another rounding.
    EXPECT_EQ(encoded(spec, x, DrawKey{1, 2, 3, 4}), payload);
    if (n > 100) {
      EXPECT_NE(encoded(spec, x, DrawKey{1, 3, 3, 4}), payload) << spec.str() << " n=" << n;
    }
    // Zero vector (and zero buckets among non-zero ones) decode to exact zeros, not NaN.
    std::vector<float> z(n, 0.0f);
    for (float v : decoded(spec, encoded(spec, z, DrawKey{}), n)) ASSERT_EQ(v, 0.0f) << spec.str() << " n=" << n;
    if (n > d) {
      std::vector<float> part = x;
      std::fill(part.begin(), part.begin() + d, 0.0f);
      const std::vector<float> y = decoded(spec, encoded(spec, part, DrawKey{}), n);
      for (size_t i = 0; i < d; i++) ASSERT_EQ(y[i], 0.0f) << spec.str() << " n=" << n << " element " << i;
    }
  }
}

TEST_P(CompressQuant, ValuesOnLevelsAreExact) {
  // |x| / scale exactly on a level leaves nothing to round: every draw decodes to x. A lone non-zero entry is the
  // bucket's scale (level 1, the others level 0); for NUQSGD with s >= 3, entries of 3, 1.5 and 0.75 in a bucket
  // whose maximum is 3 sit on its levels 1, 1/2 and 1/4.
  const auto [method, bits] = GetParam();
  const CompressSpec spec = make(method, 0, bits);
  std::vector<std::vector<float>> cases;
  for (float v : {1.0f, -2.5f, 1e-3f}) {
    std::vector<float> x(10, 0.0f);
    x[4] = v;
    cases.push_back(x);
  }
  if (method == Method::nuqsgd && bits >= 3) cases.push_back({0.0f, 3.0f, -1.5f, 0.0f, 0.75f, -3.0f});
  for (const std::vector<float>& x : cases) {
    for (int64_t step = 0; step < 20; step++) {
      const std::vector<float> y = decoded(spec, encoded(spec, x, DrawKey{0, step, 0, 0}), x.size());
      for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(y[i], x[i]) << spec.str() << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compress, CompressQuant,
                         ::testing::Combine(::testing::Values(Method::qsgd, Method::nuqsgd),
                                            ::testing::Values(2, 4, 8)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == Method::qsgd ? "qsgd" : "nuqsgd") +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------------------------------------------
// pack_bits / unpack_bits

TEST(CompressBits, PackMatchesBitStreamLayoutAndRoundTrips) {
  // Reference layout from codec.h: code i occupies bits [i b, (i + 1) b) of the stream, bit j of the stream being
  // bit j % 8 of byte j / 8. Codes are uint32, so b goes up to 31.
  std::mt19937 gen(5);
  for (int bits = 1; bits <= 31; bits++) {
    for (size_t n : {size_t(1), size_t(3), size_t(8), size_t(13), size_t(100), size_t(257)}) {
      std::vector<uint32_t> codes(n);
      for (uint32_t& c : codes) c = (uint32_t)(gen() & ((1ull << bits) - 1));
      if (n > 2) {
        codes[0] = (uint32_t)((1ull << bits) - 1);  // all ones and zero: the extremes of the range
        codes[1] = 0;
      }
      const size_t bytes = ceil_div(n * bits, 8);
      std::vector<uint8_t> want(bytes, 0);
      for (size_t i = 0; i < n; i++)
        for (int k = 0; k < bits; k++)
          if ((codes[i] >> k) & 1u) want[(i * bits + k) / 8] |= (uint8_t)(1u << ((i * bits + k) % 8));
      // Guard bytes after the stream: pack writes exactly ceil(n b / 8) bytes (the padding bits are zero).
      std::vector<uint8_t> out(bytes + 4, 0xAB);
      mt::compress::pack_bits(codes.data(), n, bits, out.data());
      for (size_t i = 0; i < bytes; i++) ASSERT_EQ(out[i], want[i]) << "bits=" << bits << " n=" << n << " byte " << i;
      for (size_t i = bytes; i < out.size(); i++) ASSERT_EQ(out[i], 0xAB) << "bits=" << bits << " n=" << n;
      std::vector<uint32_t> back(n + 1, 0xDEADBEEF);
      mt::compress::unpack_bits(out.data(), n, bits, back.data());
      for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], codes[i]) << "bits=" << bits << " n=" << n << " code " << i;
      ASSERT_EQ(back[n], 0xDEADBEEF) << "unpack wrote past n codes";
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// sign

TEST(CompressSign, DecodesToSignTimesMeanMagnitude) {
  // Zeros (and -0.0) carry the sign bit of a non-negative number: they decode to +scale, as the encoder tests
  // x < 0. The scale is mean |x| over the whole tensor, computed in double and sent as a float.
  const CompressSpec spec = make(Method::sign);
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(100), size_t(1001)}) {
    std::vector<float> x = normal_vector(n, 300 + (uint32_t)n, 3.0f);
    if (n > 5) {
      x[1] = 0.0f;
      x[2] = -0.0f;
    }
    ASSERT_EQ(mt::compress::payload_bytes(spec, n), 4 + ceil_div(n, 8)) << "n=" << n;
    double sum = 0;
    for (float v : x) sum += std::fabs((double)v);
    const double scale = sum / (double)n;
    const std::vector<uint8_t> payload = encoded(spec, x, DrawKey{});
    float sent;
    std::memcpy(&sent, payload.data(), 4);
    EXPECT_NEAR(sent, scale, 1e-6 * scale) << "n=" << n;
    std::vector<float> y0(n, 1.0f), y = y0;
    mt::compress::decode_add(spec, payload.data(), n, y.data());
    for (size_t i = 0; i < n; i++) {
      const double want = 1.0 + (x[i] < 0 ? -scale : scale);
      EXPECT_NEAR(y[i], want, 1e-6 * (1 + scale)) << "n=" << n << " element " << i << " x=" << x[i];
    }
  }
  // A zero tensor: scale 0, decodes to zeros.
  std::vector<float> z(17, 0.0f);
  for (float v : decoded(spec, encoded(spec, z, DrawKey{}), z.size())) EXPECT_EQ(v, 0.0f);
}

}  // namespace
