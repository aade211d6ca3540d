// DGC (parallel/compress/dgc.h through exchange.h) and 1-bit Adam's momentum exchange (parallel/compress/onebit.h)
// with 3 forked shm ranks: every rank's result equals, bit for bit, a serial recomputation in the parent that
// simulates all ranks from the rules in the headers (DGC: local clip at thr / sqrt(N), u = m u + g, v += u, top-k of
// v at the warm-up density, u and v zeroed where sent, sum of the payloads; 1-bit: worker sign compression with
// error feedback of b1 M + (1-b1) N g_r, the server's of the mean). Every rank's result is bit-identical to every
// other rank's (the replicas stay equal); against the serial recomputation it agrees to 1e-5 relative, not bit for
// bit, because the compiler contracts m u + g (and b1 M + ...) into fused multiply-adds differently in the library
// and in this file (measured: last-bit differences in a few elements). The 1-bit exchange's bytes follow its formula.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/params.h"
#include "parallel/compress/codec.h"
#include "parallel/compress/dgc.h"
#include "parallel/compress/exchange.h"
#include "parallel/compress/onebit.h"
#include "shm_ranks.h"

namespace {

using mt::compress::CompressSpec;
using mt::compress::Method;
using mt::nn::ParamRegistry;

constexpr int kRanks = 3, kSteps = 6;

void build_registry(ParamRegistry& p) {
  p.add("a.w", {16, 20}, {}, 0);
  p.add("a.b", {20}, {}, 0);
  p.add("b.w", {20, 7}, {}, 1);
  p.finalize();
}

bool close(float got, float want) { return std::fabs(got - want) <= 1e-5f * (1.0f + std::fabs(want)); }

// The flat buffer x[0, n) must be bit-identical on every rank.
void require_same_on_all_ranks(mt::comm::Communicator& world, const float* x, size_t n, int64_t step) {
  std::vector<float> all(n * world.size());
  world.all_gather(x, all.data(), all.size(), mt::comm::DType::f32);
  for (int q = 1; q < world.size(); q++)
    for (size_t i = 0; i < n; i++)
      MT_REQUIRE(mt::Error, all[q * n + i] == all[i], "step ", step, ": rank ", q, " element ", i, " differs");
}

float grad_value(int rank, int64_t step, size_t i) {
  const mt::CounterRng rng(31 + rank, "dgc-mr/" + std::to_string(step));
  return (float)(rng.normal(i) * (1.0 + rank));
}

// ---- DGC, serially for all ranks ----
std::vector<std::vector<float>> dgc_reference(const mt::compress::DgcOptions& o, double ratio) {
  ParamRegistry reg;
  build_registry(reg);
  const auto& ps = reg.params();
  std::vector<std::vector<std::vector<float>>> u(kRanks), v(kRanks);
  for (int r = 0; r < kRanks; r++)
    for (const auto& p : ps) {
      u[r].emplace_back(p.numel, 0.0f);
      v[r].emplace_back(p.numel, 0.0f);
    }
  std::vector<std::vector<float>> out;
  for (int64_t s = 0; s < kSteps; s++) {
    CompressSpec spec{Method::topk, mt::compress::dgc_density(ratio, o.warmup, s)};
    std::vector<float> sum(reg.size(), 0.0f);
    std::vector<std::vector<std::vector<uint8_t>>> pay(kRanks);
    for (int r = 0; r < kRanks; r++) {
      double sq = 0;
      for (const auto& p : ps)
        for (size_t i = p.offset; i < p.offset + p.numel; i++) sq += (double)grad_value(r, s, i) * grad_value(r, s, i);
      const double local = o.clip / std::sqrt((double)kRanks), f = local / (std::sqrt(sq) + 1e-6);
      const float clip = f >= 1.0 ? 1.0f : (float)f;
      for (size_t t = 0; t < ps.size(); t++) {
        std::vector<float> x(ps[t].numel);
        for (size_t i = 0; i < x.size(); i++) {
          const float g = grad_value(r, s, ps[t].offset + i) * clip;
          u[r][t][i] = o.momentum * u[r][t][i] + g;
          v[r][t][i] += u[r][t][i];
          x[i] = v[r][t][i];
        }
        pay[r].emplace_back(mt::compress::payload_bytes(spec, x.size()));
        mt::compress::encode(spec, x.data(), x.size(), {}, pay[r][t].data());
        for (uint32_t i : mt::compress::sparse_indices(spec, pay[r][t].data(), x.size())) {
          u[r][t][i] = 0.0f;
          v[r][t][i] = 0.0f;
        }
      }
    }
    for (int r = 0; r < kRanks; r++)
      for (size_t t = 0; t < ps.size(); t++)
        mt::compress::decode_add(spec, pay[r][t].data(), ps[t].numel, sum.data() + ps[t].offset);
    out.push_back(sum);
  }
  return out;
}

TEST(DgcExchange, RanksAgreeBitForBitAndWithTheSerialRule) {
  const mt::compress::DgcOptions o{true, 0.9f, 5.0, 4};  // clip 5 / sqrt(3) binds: shares have norms ~19-57
  const auto want = dgc_reference(o, 0.02);
  auto res = mt::test::run_shm_ranks(kRanks, [&](mt::comm::Communicator& world) {
    ParamRegistry reg;
    build_registry(reg);
    mt::compress::GradientExchange ex(reg, &world, CompressSpec{Method::topk, 0.02}, {}, 7, nullptr, o);
    for (int64_t s = 0; s < kSteps; s++) {
      for (size_t i = 0; i < reg.size(); i++) reg.grad()[i] = grad_value(world.rank(), s, i);
      ex.exchange(s);
      MT_REQUIRE(mt::Error, ex.clip_factor() < 1.0f, "step ", s, ": the clip should bind");
      require_same_on_all_ranks(world, reg.grad(), reg.size(), s);
      for (const auto& p : reg.params())
        for (size_t i = p.offset; i < p.offset + p.numel; i++)
          MT_REQUIRE(mt::Error, close(reg.grad()[i], want[s][i]), "step ", s, " element ", i, ": ", reg.grad()[i],
                   " vs serial ", want[s][i]);
    }
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// ---- 1-bit Adam's momentum, serially for all ranks ----
TEST(OnebitExchange, RanksAgreeBitForBitAndWithTheSerialRule) {
  const float b1 = 0.9f, scale = 0.5f;
  ParamRegistry ref_reg;
  build_registry(ref_reg);
  const auto& ps = ref_reg.params();
  std::vector<std::vector<std::vector<float>>> ew(kRanks);
  std::vector<std::vector<float>> es;
  for (const auto& p : ps) es.emplace_back(p.numel, 0.0f);
  for (int r = 0; r < kRanks; r++)
    for (const auto& p : ps) ew[r].emplace_back(p.numel, 0.0f);
  std::vector<float> M(ref_reg.size(), 0.0f);
  std::vector<std::vector<float>> want;
  for (int64_t s = 0; s < kSteps; s++) {
    std::vector<float> next(ref_reg.size());
    for (size_t t = 0; t < ps.size(); t++) {
      const size_t n = ps[t].numel, bytes = mt::compress::payload_bytes({Method::sign}, n);
      std::vector<std::vector<uint8_t>> pay(kRanks, std::vector<uint8_t>(bytes));
      std::vector<const uint8_t*> ptr;
      for (int r = 0; r < kRanks; r++) {
        std::vector<float> y(n);
        for (size_t i = 0; i < n; i++)
          y[i] = b1 * M[ps[t].offset + i] +
                 (1.0f - b1) * ((float)kRanks * (grad_value(r, s, ps[t].offset + i) * scale));
        mt::compress::sign_compress_with_error(y.data(), ew[r][t].data(), n, pay[r].data());
        ptr.push_back(pay[r].data());
      }
      mt::compress::sign_server_with_error(ptr.data(), kRanks, es[t].data(), n, next.data() + ps[t].offset);
    }
    M = next;
    want.push_back(M);
  }
  auto res = mt::test::run_shm_ranks(kRanks, [&](mt::comm::Communicator& world) {
    ParamRegistry reg;
    build_registry(reg);
    mt::compress::OnebitMomentumExchange ex(reg, &world, b1);
    std::vector<float> m(reg.size(), 0.0f), g(reg.size());
    // Bytes this rank sends per exchange: the payloads of the tensors others serve, and those it serves to the
    // N - 1 others: (P - P_r) + (N - 1) P_r with P = sum_t 4 + ceil(n_t / 8).
    size_t P = 0, Pr = 0;
    for (size_t t = 0; t < reg.params().size(); t++) {
      const size_t b = 4 + (reg.params()[t].numel + 7) / 8;
      P += b;
      if (ex.owner(t) == world.rank()) Pr += b;
    }
    for (int64_t s = 0; s < kSteps; s++) {
      for (size_t i = 0; i < reg.size(); i++) g[i] = grad_value(world.rank(), s, i);
      const uint64_t before = world.counters().total_sent();
      ex.exchange(g.data(), scale, m.data(), m.data());
      const uint64_t sent = world.counters().total_sent() - before;
      MT_REQUIRE(mt::Error, sent == (P - Pr) + (kRanks - 1) * Pr, "step ", s, ": sent ", sent, " bytes, expected ",
                 (P - Pr) + (kRanks - 1) * Pr);
      require_same_on_all_ranks(world, m.data(), m.size(), s);
      for (const auto& p : reg.params())
        for (size_t i = p.offset; i < p.offset + p.numel; i++)
          MT_REQUIRE(mt::Error, close(m[i], want[s][i]), "step ", s, " element ", i, ": ", m[i], " vs serial ", want[s][i]);
    }
  });
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
