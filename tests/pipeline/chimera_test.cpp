// Chimera (schedules/chimera.cpp): two pipelines in opposite directions over the same ranks. The placement
// (down: stage s on rank s, chunk 0; up: stage s on rank p - 1 - s, chunk 1; even micro-batches down, odd up),
// a compute order written out by hand, the checker over a sweep (complete, deadlock-free), each chunk's
// ascending order (what keeps a copy's gradient sum independent of the schedule), the activation bound, the
// simulator against the paper's closed form with F = B (bubble (p - 2) / (2m + p - 2) against 1F1B's
// (p - 1) / (m + p - 1): 0.200 against 0.429 at p = m = 4), and the refusals.
//
// Legend: p stages (ranks), m micro-batches, i micro-batch, j rank, c chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "actions.h"
#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/simulator.h"

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;
using mt::plan::CostModel;
using mt::plan::SimResult;
using mt::plan::simulate;

std::string order(const ScheduleSpec& spec, int j) { return compute_summary(make_schedule(spec)[j], 2); }

TEST(Chimera, PlacementHoldsEachStageTwiceInOppositeDirections) {
  const Placement pl = placement_of({"chimera", 4, 8, 2});
  EXPECT_EQ(pl.stages(), 4);
  EXPECT_EQ(pl.routes(), 2);
  for (int j = 0; j < 4; j++) {
    EXPECT_EQ(pl.stage_of(j, 0), j);
    EXPECT_EQ(pl.stage_of(j, 1), 3 - j);
  }
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++)
      for (int c = 0; c < 2; c++) EXPECT_EQ(pl.visits(i, j, c), i % 2 == c) << "i=" << i << " j=" << j << " c=" << c;
  EXPECT_EQ(pl.slot(1, 0), (Slot{3, 1}));  // an odd micro-batch starts on the last rank
  EXPECT_EQ(pl.slot(1, 3), (Slot{0, 1}));  // and ends (the loss) on rank 0
}

TEST(Chimera, ComputeOrderFourRanksFourMicroBatches) {
  // By hand, one unit per F and B (start times): F0 starts down on rank 0 and F1 up on rank 3 at t = 0, F2
  // follows on rank 0 at 1 and F3 on rank 3 at 1; F1 reaches rank 0 (up stage 3) at 3, its backward runs there
  // at 4 and goes back one rank per unit; F0 reaches rank 3 at 3, B0 there at 4, on rank 0 at 7. A ready
  // backward goes before a forward, the smaller micro-batch first. Rank 0: F0 0, F2 1, F1 3, B1 4, F3 5, B3 6,
  // B0 7, B2 9 (idle at 2 and 8); the last backwards end at 10 = 2m + p - 2.
  const ScheduleSpec spec{"chimera", 4, 4, 2};
  EXPECT_EQ(order(spec, 0), "F0c0 F2c0 F1c1 B1c1 F3c1 B3c1 B0c0 B2c0");
  EXPECT_EQ(order(spec, 1), "F0c0 F1c1 F2c0 F3c1 B1c1 B0c0 B3c1 B2c0");
  EXPECT_EQ(order(spec, 2), "F1c1 F0c0 F3c1 F2c0 B0c0 B1c1 B2c0 B3c1");
  EXPECT_EQ(order(spec, 3), "F1c1 F3c1 F0c0 B0c0 F2c0 B2c0 B1c1 B3c1");
  const SimResult r = simulate(spec, CostModel{1.0, 1.0, 0.0});  // a chunk's F = B = 1
  EXPECT_EQ(r.makespan, 10);
}

TEST(Chimera, ListsAreCompleteDeadlockFreeAscendingAndBounded) {
  int checked = 0;
  for (int p = 2; p <= 8; p += 2)
    for (int m = 2; m <= 16; m += 2) {
      const ScheduleSpec spec{"chimera", p, m, 2};
      const Schedule s = make_schedule(spec);
      EXPECT_EQ(check_error(spec, s), "(passed)") << "p=" << p << " m=" << m;
      checked++;
      for (int j = 0; j < p; j++) {
        // 1F1B's activation memory on its rank 0: p micro-batches of one stage.
        EXPECT_LE(peak_in_flight(s[j]), p) << "p=" << p << " m=" << m << " j=" << j;
        for (int c = 0; c < 2; c++)
          for (ActionKind kind : {ActionKind::forward, ActionKind::backward}) {
            std::vector<int> seen;
            for (const Action& a : s[j])
              if (a.kind == kind && a.chunk == c) seen.push_back(a.micro_batch);
            std::vector<int> want;
            for (int i = c; i < m; i += 2) want.push_back(i);
            EXPECT_EQ(seen, want) << "p=" << p << " m=" << m << " j=" << j << " c=" << c << " " << to_string(kind);
          }
      }
    }
  EXPECT_EQ(checked, 4 * 8);
}

TEST(ChimeraSimulator, PapersClosedFormAtFourStagesFourMicroBatches) {
  // F = B (R = 1), messages free: Chimera (D - 2) / (2N + D - 2), 1F1B (D - 1) / (N + D - 1), N = m the
  // micro-batches of one step (each rank computes all of them, half of them on each of its two stages).
  const SimResult chimera = simulate({"chimera", 4, 4, 2}, CostModel{1.0, 1.0, 0.0});
  const SimResult one = simulate({"1f1b", 4, 4, 1}, CostModel{1.0, 1.0, 0.0});
  EXPECT_DOUBLE_EQ(chimera.bubble_fraction, 0.2);
  EXPECT_NEAR(one.bubble_fraction, 3.0 / 7.0, 1e-12);
  EXPECT_NEAR(one.bubble_fraction, 0.429, 5e-4);
  // Every rank is equally busy (one stage of each pipeline: the same work), so each idles p - 2 units.
  for (int j = 0; j < 4; j++) EXPECT_DOUBLE_EQ(chimera.makespan - chimera.busy_per_rank[j], 2.0) << "rank " << j;
}

TEST(ChimeraSimulator, ClosedFormWhenMIsAMultipleOfP) {
  // The paper's form holds for m a multiple of p (its basic unit of p micro-batches, p/2 each way, repeated).
  // Otherwise this order idles p - (m mod p) units more per rank (what it does, not a paper's form); for m >= p
  // still less than 1F1B.
  for (int p = 2; p <= 8; p += 2)
    for (int m = 2; m <= 24; m += 2) {
      const SimResult r = simulate({"chimera", p, m, 2}, CostModel{1.0, 1.0, 0.0});
      const int extra = m % p == 0 ? 0 : p - m % p;
      EXPECT_DOUBLE_EQ(r.makespan, 2.0 * m + p - 2 + extra) << "p=" << p << " m=" << m;
      if (m % p == 0) {
        EXPECT_NEAR(r.bubble_fraction, (p - 2.0) / (2.0 * m + p - 2), 1e-12) << "p=" << p << " m=" << m;
      }
      if (m >= p) {
        EXPECT_LT(r.bubble_fraction, simulate({"1f1b", p, m, 1}, CostModel{1.0, 1.0, 0.0}).bubble_fraction)
            << "p=" << p << " m=" << m;
      }
    }
}

TEST(Chimera, RefusesOddStagesOddMicroBatchesAndOtherChunkCounts) {
  auto message = [](const ScheduleSpec& spec) -> std::string {
    try {
      make_schedule(spec);
    } catch (const mt::InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message({"chimera", 3, 4, 2})
                .find("chimera needs an even number of stages (--pp), got 3 (--stages in meshtrain simulate and "
                      "bench pipeline)"),
            std::string::npos)
      << message({"chimera", 3, 4, 2});
  EXPECT_NE(message({"chimera", 4, 5, 2}).find("it needs an even number of micro-batches per pipeline rank, got 5"),
            std::string::npos)
      << message({"chimera", 4, 5, 2});
  EXPECT_NE(message({"chimera", 4, 4, 1}).find("got V = 1 virtual stages; give --virtual-stages 2"), std::string::npos)
      << message({"chimera", 4, 4, 1});
}

}  // namespace
