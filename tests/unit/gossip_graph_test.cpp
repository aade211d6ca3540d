// The gossip graphs' mixing matrices (parallel/data/gossip.h) for 1..8 ranks, and the low-precision exchange's
// min-max 8-bit quantizer, against facts written out here: every W doubly stochastic with non-negative entries,
// the ring's entries 1/3 on the diagonal and both neighbours (1/2 and the complete graph at n = 2), the exponential
// graph one peer at hop 2^(s mod ceil(log2 n)) and exact averaging after ceil(log2 n) steps when n is a power
// of two; what each rank sends is what its peers expect to receive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/data/gossip.h"

namespace {

using mt::parallel::GossipGraph;
using mt::parallel::mixing_matrix;
using mt::parallel::mixing_row;

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int n) {
  std::vector<double> c((size_t)n * n, 0.0);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n; k++)
      for (int j = 0; j < n; j++) c[(size_t)i * n + j] += a[(size_t)i * n + k] * b[(size_t)k * n + j];
  return c;
}

TEST(GossipGraph, DoublyStochasticForOneToEightRanks) {
  for (GossipGraph g : {GossipGraph::ring, GossipGraph::exp})
    for (int n = 1; n <= 8; n++)
      for (int64_t s = 0; s < 7; s++) {
        const std::vector<double> W = mixing_matrix(g, n, s);
        for (int i = 0; i < n; i++) {
          double row = 0, col = 0;
          for (int j = 0; j < n; j++) {
            EXPECT_GE(W[(size_t)i * n + j], 0.0);
            row += W[(size_t)i * n + j];
            col += W[(size_t)j * n + i];
          }
          // float weights (1/3 rounds to 0.33333334): the sums are 1 to float32 rounding.
          EXPECT_NEAR(row, 1.0, 1e-7) << "graph " << (int)g << " n " << n << " s " << s << " row " << i;
          EXPECT_NEAR(col, 1.0, 1e-7) << "graph " << (int)g << " n " << n << " s " << s << " column " << i;
        }
      }
}

TEST(GossipGraph, RingEntries) {
  EXPECT_EQ(mixing_matrix(GossipGraph::ring, 1, 0), std::vector<double>{1.0});
  EXPECT_EQ(mixing_matrix(GossipGraph::ring, 2, 5), (std::vector<double>{0.5, 0.5, 0.5, 0.5}));
  for (int n = 3; n <= 8; n++) {
    const std::vector<double> W = mixing_matrix(GossipGraph::ring, n, 3);
    const double third = (double)(1.0f / 3.0f);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        const int d = ((j - i) % n + n) % n;
        const double want = d == 0 || d == 1 || d == n - 1 ? third : 0.0;
        EXPECT_EQ(W[(size_t)i * n + j], want) << "n " << n << " W[" << i << "][" << j << "]";
        EXPECT_EQ(W[(size_t)i * n + j], W[(size_t)j * n + i]);  // symmetric
      }
  }
}

TEST(GossipGraph, ExponentialOnePeerPerStep) {
  for (int n = 2; n <= 8; n++) {
    const int tau = n <= 2 ? 1 : n <= 4 ? 2 : 3;  // ceil(log2 n)
    for (int64_t s = 0; s < 9; s++) {
      const int d = 1 << (s % tau);
      const std::vector<double> W = mixing_matrix(GossipGraph::exp, n, s);
      for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
          const double want = j == i || j == ((i - d) % n + n) % n ? 0.5 : 0.0;
          EXPECT_EQ(W[(size_t)i * n + j], want) << "n " << n << " s " << s << " W[" << i << "][" << j << "]";
        }
    }
  }
  // n a power of two: tau steps of the one-peer graph average exactly (every entry 1/n).
  for (int n : {2, 4, 8}) {
    const int tau = n == 2 ? 1 : n == 4 ? 2 : 3;
    std::vector<double> P = mixing_matrix(GossipGraph::exp, n, 0);
    for (int s = 1; s < tau; s++) P = matmul(mixing_matrix(GossipGraph::exp, n, s), P, n);
    for (double v : P) EXPECT_EQ(v, 1.0 / n) << "n " << n;
  }
}

TEST(GossipGraph, SendsMatchReceives) {
  for (GossipGraph g : {GossipGraph::ring, GossipGraph::exp})
    for (int n = 1; n <= 8; n++)
      for (int64_t s = 0; s < 5; s++)
        for (int r = 0; r < n; r++) {
          const auto row = mixing_row(g, n, r, s);
          ASSERT_EQ(row.from.size(), row.weight.size());
          for (int peer : row.to) {
            const auto other = mixing_row(g, n, peer, s);
            int hits = 0;
            for (int f : other.from) hits += f == r;
            EXPECT_EQ(hits, 1) << "graph " << (int)g << " n " << n << " s " << s << ": " << r << " -> " << peer;
          }
          size_t senders = 0;
          for (int p = 0; p < n; p++)
            for (int t : mixing_row(g, n, p, s).to) senders += t == r;
          EXPECT_EQ(senders, row.from.size()) << "n " << n << " rank " << r;
        }
}

using mt::parallel::LowPrecisionGossip;

TEST(LowPrecisionQuantizer, MinMaxEightBitsPerBlock) {
  const size_t n = 1300;  // 3 blocks of 512, the last partial
  ASSERT_EQ(LowPrecisionGossip::payload_bytes(n), 3 * 8 + n);
  std::vector<float> z(n);
  for (size_t i = 0; i < n; i++) z[i] = std::sin(0.37f * (float)i) * (i < 512 ? 1.0f : 0.01f);
  for (size_t i = 1024; i < n; i++) z[i] = -0.25f;  // a constant block: decoded exactly
  std::vector<uint8_t> q(LowPrecisionGossip::payload_bytes(n));
  LowPrecisionGossip::encode(z.data(), n, q.data());
  std::vector<float> y(n, 0.0f);
  LowPrecisionGossip::decode_add(q.data(), n, y.data());
  for (size_t b = 0; b < 3; b++) {
    const size_t i0 = b * 512, i1 = std::min(n, i0 + 512);
    float lo = z[i0], hi = z[i0];
    for (size_t i = i0; i < i1; i++) lo = std::min(lo, z[i]), hi = std::max(hi, z[i]);
    // half a level, (hi - lo) / 510, plus float32 rounding of lo + code * step
    const double bound = (hi - lo) / 510.0 + 4e-7 * std::max(std::fabs(lo), std::fabs(hi));
    for (size_t i = i0; i < i1; i++) EXPECT_LE(std::fabs((double)y[i] - z[i]), bound) << "element " << i;
  }
  for (size_t i = 1024; i < n; i++) EXPECT_EQ(y[i], -0.25f);
  // the first block's extremes are levels 0 and 255 (codes follow the 3 blocks' 8-byte headers)
  const size_t lo_at = std::min_element(z.begin(), z.begin() + 512) - z.begin();
  const size_t hi_at = std::max_element(z.begin(), z.begin() + 512) - z.begin();
  EXPECT_EQ(q[24 + lo_at], 0);
  EXPECT_EQ(q[24 + hi_at], 255);
}

}  // namespace
