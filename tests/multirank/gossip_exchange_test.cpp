// The decentralized exchanges on forked shm ranks: the full-precision mixer (parallel/data/gossip.h) against
// the graphs' averages written out here, the consensus distance against a float64 computation of its
// definition, BAGUA's low-precision exchange against its rule (and its neighbour copies equal to the
// neighbours' models bit for bit), and --sync gossip's exchange (train/gossip_sync.h) at 2 ranks equal to exact
// data parallelism with SGD. Inputs are small integers (or halves of them) wherever the claim is bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "parallel/data/gossip.h"
#include "parallel/mesh/mesh.h"
#include "sgd_exchange_rig.h"
#include "shm_ranks.h"
#include "train/gossip_sync.h"

namespace {

using mt::parallel::GossipGraph;

// x_r[i] = 8 r + i. exp at 4 ranks, step s: hop d = 2^(s mod 2), x_r <- (x_r + x_{r-d}) / 2, exact in float.
// ring at 4 ranks: x_r <- (x_{r-1} + x_r + x_{r+1}) / 3, to float32 rounding.
TEST(GossipMixer, ExpAndRingAverageTheRightNeighbours) {
  const size_t N = 5;
  auto res = mt::test::run_shm_ranks(
      4,
      [&](mt::comm::Communicator& world) {
        const int r = world.rank(), n = 4;
        auto value = [](int rank, size_t i) { return (float)(8 * rank + (int)i); };
        for (int64_t s : {0, 1, 2}) {
          std::vector<float> x(N);
          for (size_t i = 0; i < N; i++) x[i] = value(r, i);
          mt::parallel::GossipMixer(&world, GossipGraph::exp, N).mix(x.data(), s);
          const int d = 1 << (s % 2);
          for (size_t i = 0; i < N; i++) {
            const float want = (value(r, i) + value((r - d + n) % n, i)) / 2;
            MT_REQUIRE(mt::Error, x[i] == want, "exp rank ", r, " step ", s, " x[", i, "] = ", x[i], ", want ", want);
          }
        }
        std::vector<float> x(N);
        for (size_t i = 0; i < N; i++) x[i] = value(r, i);
        mt::parallel::GossipMixer(&world, GossipGraph::ring, N).mix(x.data(), 0);
        for (size_t i = 0; i < N; i++) {
          const double want = (value((r + 3) % n, i) + value(r, i) + value((r + 1) % n, i)) / 3.0;
          MT_REQUIRE(mt::Error, std::fabs(x[i] - want) <= 1e-6 * std::fabs(want), "ring rank ", r, " x[", i,
                     "] = ", x[i], ", want ", want);
        }
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// Xi = sqrt((1/n) sum_r |x_r - xbar|^2) at 3 ranks, x_r[i] = 0.25 r^2 + 0.5 i: computed here in float64.
TEST(ConsensusDistance, MatchesItsDefinition) {
  const size_t N = 7;
  auto res = mt::test::run_shm_ranks(
      3,
      [&](mt::comm::Communicator& world) {
        auto value = [](int rank, size_t i) { return 0.25 * rank * rank + 0.5 * (double)i; };
        std::vector<float> x(N);
        for (size_t i = 0; i < N; i++) x[i] = (float)value(world.rank(), i);
        uint64_t sent = 0;
        const double got = mt::train::consensus_distance(&world, x.data(), N, &sent);
        double sq = 0;
        for (size_t i = 0; i < N; i++) {
          const double mean = (value(0, i) + value(1, i) + value(2, i)) / 3;
          for (int q = 0; q < 3; q++) sq += (value(q, i) - mean) * (value(q, i) - mean);
        }
        const double want = std::sqrt(sq / 3);  // = sqrt(7 * 0.2917) here
        MT_REQUIRE(mt::Error, std::fabs(got - want) <= 1e-6 * want, "rank ", world.rank(), " Xi = ", got, ", want ",
                   want);
        MT_REQUIRE(mt::Error, sent > 0, "the measurement's bytes were not reported");
        // equal replicas: exactly 0
        for (size_t i = 0; i < N; i++) x[i] = (float)value(1, i);
        const double zero = mt::train::consensus_distance(&world, x.data(), N);
        MT_REQUIRE(mt::Error, zero == 0.0, "equal replicas give Xi = ", zero);
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// BAGUA's rule at 4 ranks on the ring, 3 steps; "the optimizer" adds delta_r(s)[i] = 0.01 (r + 1) sin(i + s).
// Each step: z_ref = delta + sum_j W_rj (x_j - x_r) in float64 from every rank's model (all_gather); the step's
// move x_{t+1} - x_t must be z_ref within half a quantization level of its block ((max - min) / 510) plus
// float32 rounding; and every rank's copies of its neighbours must equal their models bit for bit.
TEST(LowPrecisionGossip, FollowsTheRuleAndKeepsExactNeighbourCopies) {
  const size_t N = 700;  // two blocks of 512
  auto res = mt::test::run_shm_ranks(
      4,
      [&](mt::comm::Communicator& world) {
        const int r = world.rank(), n = 4;
        std::vector<float> x(N);
        for (size_t i = 0; i < N; i++) x[i] = 0.1f * (float)(i % 13);
        mt::parallel::LowPrecisionGossip lp(&world, N);
        lp.begin(x.data());
        std::vector<float> all((size_t)n * N);
        for (int64_t s = 0; s < 3; s++) {
          world.all_gather(x.data(), all.data(), (size_t)n * N, mt::comm::DType::f32);
          const std::vector<float> xt = x;
          std::vector<double> zref(N);
          for (size_t i = 0; i < N; i++) {
            const double delta = 0.01 * (r + 1) * std::sin((double)i + (double)s);
            x[i] = xt[i] + (float)delta;
            const double left = all[(size_t)((r + 3) % n) * N + i], right = all[(size_t)((r + 1) % n) * N + i];
            zref[i] = delta + (double)(1.0f / 3.0f) * ((left - xt[i]) + (right - xt[i]));
          }
          lp.exchange(x.data(), s);
          for (size_t b = 0; b < 2; b++) {
            const size_t i0 = b * 512, i1 = std::min(N, i0 + 512);
            double lo = zref[i0], hi = zref[i0];
            for (size_t i = i0; i < i1; i++) lo = std::min(lo, zref[i]), hi = std::max(hi, zref[i]);
            const double bound = (hi - lo) / 510 + 2e-6;  // + float32 rounding of z's terms (|x| < 1.3)
            for (size_t i = i0; i < i1; i++) {
              const double moved = (double)x[i] - xt[i];
              MT_REQUIRE(mt::Error, std::fabs(moved - zref[i]) <= bound, "rank ", r, " step ", s, " element ", i,
                         ": moved ", moved, ", rule says ", zref[i], " (bound ", bound, ")");
            }
          }
          world.all_gather(x.data(), all.data(), (size_t)n * N, mt::comm::DType::f32);
          const int peers[2] = {(r + 3) % n, (r + 1) % n};  // mixing_row's order: left, right
          for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < N; i++)
              MT_REQUIRE(mt::Error, lp.neighbour(k)[i] == all[(size_t)peers[k] * N + i], "rank ", r, " step ", s,
                         ": copy of rank ", peers[k], " [", i, "] = ", lp.neighbour(k)[i], ", that rank has ",
                         all[(size_t)peers[k] * N + i]);
        }
      },
      60);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

// --sync gossip at 2 ranks (the ring is the complete graph, W = J / 2) with SGD, lr 1/2, no momentum: rank r's
// gradient of element i at step s is r + 1 + i + s (its part of the global batch's sum); exact data parallelism
// gives p -= (1/2)(g_0 + g_1) = -(3 + 2i + 2s) / 2 per step; gossip steps p_r - (1/2) 2 g_r on each rank and
// averages: the same values, exact in float. The consensus distance (every step) is 0: both replicas are the
// same bits (0.5 a + 0.5 b on both).
TEST(GossipSync, CompleteGraphWithSgdIsExactDataParallelism) {
  auto res = mt::test::run_shm_ranks(
      2,
      [&](mt::comm::Communicator& world) {
        const int r = world.rank();
        mt::parallel::Mesh mesh(&world, mt::parallel::MeshGrid(2, 2, 1, 1));
        mt::train::SyncOptions o;
        o.method = mt::train::SyncMethod::gossip;
        o.consensus_every = 1;
        o.steps = 100;
        const mt::train::StoreGroups on = store_groups(o, mesh);
        MT_REQUIRE(mt::Error, on.group == nullptr, "the decentralized store must reduce nothing");
        mt::test::SgdExchangeRig rig(o, mesh, on);
        rig.sync->begin_run(0);
        std::vector<float> want(rig.params.size(), 0.0f);
        for (int64_t s = 0; s < 3; s++) {
          const nlohmann::json row = rig.step(s, r);
          MT_REQUIRE(mt::Error, row.value("consensus_distance", -1.0) == 0.0, "step ", s, " row ", row.dump());
          for (const mt::nn::Param& p : rig.params.params())
            for (size_t i = 0; i < p.numel; i++) {
              const float w = -(float)(3 + 2 * (int64_t)i + 2 * s) / 2;
              const size_t at = (size_t)(p.data - rig.params.data()) + i;
              want[at] += w;
              MT_REQUIRE(mt::Error, p.data[i] == want[at], "rank ", r, " step ", s, " ", p.name, "[", i,
                         "] = ", p.data[i], ", want ", want[at]);
            }
        }
      },
      30);
  EXPECT_EQ(res.exit_code, 0) << "rank " << res.failed_rank << ": " << res.failure;
}

}  // namespace
