// The simulator fed what each rank took for each of its chunks (CostModel::rank_chunk_*), and the bubble report
// that builds those costs from the ranks' stats. Under chimera each stage is held by two ranks (one per route);
// when they run at different speeds the mean per stage gives a figure no rank ran.
//
// Legend: p ranks, m micro-batches, j rank, c chunk; f_j / b_j rank j's forward / backward of one chunk.
//
// Chimera p = 2, m = 2 by hand (C = 0). Rank 0 holds stage 0 of the down route (chunk 0) and stage 1 of the up
// route (chunk 1); rank 1 the reverse. Micro-batch 0 goes down, 1 up. Lists (checked below):
//   rank 0: F0c0 F1c1 B1c1 B0c0        rank 1: F1c1 F0c0 B0c0 B1c1
// With M = max(f0, f1): rank 0's F1c1 waits for rank 1's F1c1 (ends f1) and its own F0c0 (f0): ends M + f0;
// B1c1 (the up route's last stage) then ends M + f0 + b0. Likewise rank 1's B0c0 ends M + f1 + b1. Each rank's
// last backward waits for the other's: both start at M + max(f0 + b0, f1 + b1), rank j's ends b_j later.
// Rank 0 twice as slow as rank 1 (f0 = 2, b0 = 4; f1 = 1, b1 = 2): makespan 2 + 6 + 4 = 12, busy 12 + 6 = 18,
// bubble 1 - 18 / 24 = 0.25. The per-stage mean (every box f = 1.5, b = 3): makespan 1.5 + 4.5 + 3 = 9, the same
// busy 18, bubble 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stats.h"
#include "plan/bubble.h"
#include "plan/simulator.h"

namespace {

using mt::pipeline::PipelineStats;
using mt::pipeline::ScheduleSpec;
using mt::plan::CostModel;
using mt::plan::SimResult;
using mt::plan::simulate;

const ScheduleSpec kChimera{"chimera", 2, 2, 2};

// Rank j's compute order, e.g. "F0c0 F1c1 B1c1 B0c0".
std::string order(const ScheduleSpec& spec, int j) {
  return mt::pipeline::compute_summary(mt::pipeline::make_schedule(spec)[j], 2);
}

// f[j], b[j]: rank j's times for both of its chunks.
CostModel per_rank(double f0, double b0, double f1, double b1) {
  CostModel c;
  c.rank_chunk_forward = {f0, f0, f1, f1};
  c.rank_chunk_backward = {b0, b0, b1, b1};
  return c;
}

TEST(RankChunkCosts, ChimeraListsAsWorkedOutByHand) {
  EXPECT_EQ(order(kChimera, 0), "F0c0 F1c1 B1c1 B0c0");
  EXPECT_EQ(order(kChimera, 1), "F1c1 F0c0 B0c0 B1c1");
  const SimResult r = simulate(kChimera, CostModel{1.0, 1.0, 0.0});
  EXPECT_EQ(r.placement.stage_of(0, 0), 0);
  EXPECT_EQ(r.placement.stage_of(0, 1), 1);
  EXPECT_EQ(r.placement.stage_of(1, 0), 1);
  EXPECT_EQ(r.placement.stage_of(1, 1), 0);
}

TEST(RankChunkCosts, ChimeraWithOneSlowRankIsNotTheStageMean) {
  const SimResult r = simulate(kChimera, per_rank(2, 4, 1, 2));
  EXPECT_DOUBLE_EQ(r.makespan, 12);
  EXPECT_DOUBLE_EQ(r.busy, 18);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.25);
  // Rank 0's boxes by hand: F0c0 0-2, F1c1 2-4, B1c1 4-8, B0c0 8-12.
  ASSERT_EQ(r.boxes[0].size(), 4u);
  EXPECT_DOUBLE_EQ(r.boxes[0][1].start, 2);
  EXPECT_DOUBLE_EQ(r.boxes[0][3].start, 8);
  EXPECT_DOUBLE_EQ(r.boxes[1][3].start, 8);  // rank 1's B1c1 waits for rank 0's B1c1
  EXPECT_DOUBLE_EQ(r.boxes[1][3].end, 10);

  // The same run summarized per stage (each stage's mean over its two holders): no bubble at all.
  CostModel stage;
  stage.stage_forward = {1.5, 1.5};
  stage.stage_backward = {3, 3};
  const SimResult s = simulate(kChimera, stage);
  EXPECT_DOUBLE_EQ(s.makespan, 9);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0);
  // Per (rank, chunk) times replace the per-stage ones where both are given.
  CostModel both = per_rank(2, 4, 1, 2);
  both.stage_forward = stage.stage_forward;
  both.stage_backward = stage.stage_backward;
  EXPECT_DOUBLE_EQ(simulate(kChimera, both).makespan, 12);
}

TEST(RankChunkCosts, GeneralFormulaOverASweep) {
  // makespan = M + max(f0 + b0, f1 + b1) + max(b0, b1), M = max(f0, f1) (the derivation at the top).
  const double vals[] = {0.5, 1, 1.5, 3};
  for (double f0 : vals)
    for (double b0 : vals)
      for (double f1 : vals)
        for (double b1 : vals) {
          const SimResult r = simulate(kChimera, per_rank(f0, b0, f1, b1));
          EXPECT_DOUBLE_EQ(r.makespan,
                           std::max(f0, f1) + std::max(f0 + b0, f1 + b1) + std::max(b0, b1))
              << f0 << " " << b0 << " " << f1 << " " << b1;
        }
}

TEST(RankChunkCosts, OneChunkSchedulesEqualThePerStageReplay) {
  // With one chunk per rank, (rank j, chunk 0) is stage j: both forms give the same timeline.
  for (const char* name : {"gpipe", "1f1b", "zb-h1", "zb-h2"})
    for (int m = 2; m <= 6; m++) {
      CostModel stage, box;
      stage.stage_forward = box.rank_chunk_forward = {1.0, 1.7, 0.6};
      stage.stage_backward = box.rank_chunk_backward = {2.1, 3.0, 1.4};
      stage.stage_weight = box.rank_chunk_weight = {1.0, 0.5, 0.9};
      const ScheduleSpec spec{name, 3, m, 1};
      EXPECT_DOUBLE_EQ(simulate(spec, stage).makespan, simulate(spec, box).makespan) << name << " m=" << m;
    }
}

TEST(RankChunkCosts, SplitBackwardTakesEachRanksWeightHalf) {
  // zb-h1 p = 2 m = 1: F0 on rank 0 (1), F0 on rank 1 (2), I on rank 1 (5 - W1), I on rank 0 (3 - W0), W0;
  // rank 1's W overlaps rank 0's I. W0 = 1, W1 = 4: rank 1's I ends 1 + 2 + 1 = 4, rank 0's I 4 + 2 = 6, W0 7;
  // rank 1's W 4 + 4 = 8: makespan 8 (MeasuredHalves' timeline, given per (rank, chunk) here).
  CostModel c;
  c.rank_chunk_forward = {1, 2};
  c.rank_chunk_backward = {3, 5};
  c.rank_chunk_weight = {1, 4};
  EXPECT_DOUBLE_EQ(simulate({"zb-h1", 2, 1, 1}, c).makespan, 8);
  c.rank_chunk_weight.clear();  // no measured halves: the share w = 1/2 splits each backward
  EXPECT_DOUBLE_EQ(simulate({"zb-h1", 2, 1, 1}, c).makespan, 8.5);
}

TEST(RankChunkCosts, RefusesMalformedCosts) {
  CostModel c = per_rank(1, 2, 1, 2);
  c.rank_chunk_forward.pop_back();
  EXPECT_THROW(simulate(kChimera, c), mt::InputError);
  c = per_rank(1, 2, 1, 2);
  c.rank_chunk_backward.pop_back();
  EXPECT_THROW(simulate(kChimera, c), mt::InputError);
  c = per_rank(1, -2, 1, 2);
  EXPECT_THROW(simulate(kChimera, c), mt::InputError);
  c = per_rank(1, 2, 1, 2);
  c.rank_chunk_weight = {1, 1, 3, 1};  // longer than rank 1 chunk 0's backward
  try {
    simulate({"zb-v", 2, 2, 2}, c);
    FAIL() << "a weight half longer than its backward was accepted";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 chunk 0"), std::string::npos) << e.what();
  }
}

// Rank j's stats for one timed chimera list (p = 2, m = 2: one micro-batch per chunk), f / b its per-chunk times.
PipelineStats stats(double f, double b, double span) {
  PipelineStats st;
  st.lists = 1;
  st.span_us = span * 1000;
  st.chunk_forward_us = {f * 1000, f * 1000};
  st.chunk_backward_us = {b * 1000, b * 1000};
  st.chunk_weight_us = {0, 0};
  st.forward_us = 2 * f * 1000;
  st.backward_us = 2 * b * 1000;
  return st;
}

TEST(RankChunkCosts, BubbleReportSimulatesWhatEachRankTook) {
  // The slow-rank-0 run above, as the trainer gathers it (through the float packing): measured spans 12 ms.
  std::vector<PipelineStats> ranks = {stats(2, 4, 12), stats(1, 2, 12)};
  for (auto& st : ranks) {
    std::vector<float> buf(mt::plan::packed_size(2));
    mt::plan::pack(st, 2, buf.data());
    st = mt::plan::unpack(buf.data(), 2);
  }
  const auto rep = mt::plan::bubble_report(kChimera, ranks, true);
  ASSERT_EQ(rep.cost.rank_chunk_forward.size(), 4u);
  EXPECT_NEAR(rep.cost.rank_chunk_forward[0], 2, 1e-6);
  EXPECT_NEAR(rep.cost.rank_chunk_forward[3], 1, 1e-6);
  EXPECT_NEAR(rep.cost.rank_chunk_backward[1], 4, 1e-6);
  EXPECT_NEAR(rep.cost.rank_chunk_backward[2], 2, 1e-6);
  EXPECT_TRUE(rep.cost.rank_chunk_weight.empty());  // chimera does not split its backward
  // The per-stage means are still reported beside them.
  ASSERT_EQ(rep.cost.stage_forward.size(), 2u);
  EXPECT_NEAR(rep.cost.stage_forward[0], 1.5, 1e-6);
  EXPECT_NEAR(rep.cost.stage_backward[1], 3, 1e-6);
  EXPECT_NEAR(rep.measured, 0.25, 1e-9);
  EXPECT_NEAR(rep.simulated, 0.25, 1e-6);  // the per-stage mean would give 0
  EXPECT_NEAR(rep.simulated_free_messages, 0.25, 1e-6);
  EXPECT_NEAR(rep.simulated_stage_means, 0, 1e-6);  // the earlier figure, beside it

  // A rank that did not measure its chunks: the per-stage times stand (here rank 1's chunk times are missing,
  // so its stages get only rank 0's share of the mean: the fallback is the old per-stage figure).
  std::vector<PipelineStats> partial = ranks;
  partial[1].chunk_forward_us.clear();
  partial[1].chunk_backward_us.clear();
  const auto fallback = mt::plan::bubble_report(kChimera, partial, true);
  EXPECT_TRUE(fallback.cost.rank_chunk_forward.empty());
  EXPECT_DOUBLE_EQ(fallback.simulated_stage_means, -1);
  CostModel stage_only = fallback.cost;
  EXPECT_DOUBLE_EQ(fallback.simulated, simulate(kChimera, stage_only).bubble_fraction);
}

}  // namespace
