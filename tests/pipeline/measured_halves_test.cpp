// The simulator fed measured per-stage costs with the split backward's two halves measured too
// (CostModel::stage_weight), and the bubble report that builds those costs from the ranks' stats
// (PipelineStats::chunk_weight_us). Closed forms with unequal F, I (input half) and W (weight half), a
// timeline worked out by hand where the halves differ per stage, and the report's packing.
//
// Legend: p stages (ranks), m micro-batches, F forward, I / W the input and weight halves of a stage's backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "plan/bubble.h"
#include "plan/simulator.h"

namespace {

using mt::pipeline::ScheduleSpec;
using mt::plan::CostModel;
using mt::plan::SimResult;
using mt::plan::simulate;

// Every stage costs F, I + W (W of it the weight half), given per stage as measured costs are.
CostModel per_stage(int stages, double F, double I, double W) {
  CostModel c;
  c.stage_forward.assign(stages, F);
  c.stage_backward.assign(stages, I + W);
  c.stage_weight.assign(stages, W);
  return c;
}

double idle(const SimResult& r, int j) { return r.makespan - r.busy_per_rank[j]; }

struct Costs {
  double F, I, W;
};
// The papers' F = I = W; unequal halves both ways; halves longer than the forward; a forward longer than both.
const Costs kCosts[] = {{1.0, 1.0, 1.0}, {1.0, 1.5, 0.5}, {1.0, 0.75, 1.25}, {2.0, 1.0, 0.5}, {1.0, 1.2, 0.9},
                        {1.0, 1.8, 0.2}, {1.0, 3.0, 3.0}, {1.0, 2.0, 3.0}, {1.0, 2.4, 1.6}, {1.0, 0.3, 2.7}};

TEST(MeasuredHalves, OneFOneBIgnoresTheSplit) {
  // 1F1B has no split backward: makespan (m + p - 1)(F + I + W) whatever W's part is.
  for (const Costs c : kCosts)
    for (int p = 2; p <= 5; p++)
      for (int m = p; m <= 10; m++)
        EXPECT_NEAR(simulate({"1f1b", p, m, 1}, per_stage(p, c.F, c.I, c.W)).makespan,
                    (m + p - 1) * (c.F + c.I + c.W), 1e-9)
            << "p=" << p << " m=" << m;
}

TEST(MeasuredHalves, H1IdlesPMinusOneTimesTheLongestLink) {
  // zb-h1 (m >= p): every rank idles (p - 1) max(F + I - W, F, I). With F = I = W that is the paper's
  // (p - 1)(F + I - W); a weight half longer than I cannot fill more than the input half leaves, and an input
  // half longer than F + I - W sets the pace of the last rank's gradients on its own.
  for (const Costs c : kCosts)
    for (int p = 2; p <= 5; p++)
      for (int m = p; m <= 12; m++) {
        const SimResult r = simulate({"zb-h1", p, m, 1}, per_stage(p, c.F, c.I, c.W));
        const double each = (p - 1) * std::max({c.F + c.I - c.W, c.F, c.I});
        EXPECT_NEAR(r.makespan, m * (c.F + c.I + c.W) + each, 1e-9)
            << "F=" << c.F << " I=" << c.I << " W=" << c.W << " p=" << p << " m=" << m;
        for (int j = 0; j < p; j++)
          EXPECT_NEAR(idle(r, j), each, 1e-9) << "F=" << c.F << " I=" << c.I << " W=" << c.W << " p=" << p
                                                << " m=" << m << " j=" << j;
      }
}

TEST(MeasuredHalves, H2IdlesTheSkewUnlessTheInputHalfIsLong) {
  // zb-h2 (m >= 2p - 1): every rank idles (p - 1)(F + max(0, I - 2 min(F, W))). The first term is the skew of the
  // start, (p - 1) F, which no schedule ending in its own step avoids (makespan (p - 1) F + m (F + I + W)); the
  // second appears when an input half is longer than two weight halves (or two forwards), which the steady
  // state cannot hide behind.
  for (const Costs c : kCosts)
    for (int p = 2; p <= 5; p++)
      for (int m = 2 * p - 1; m <= 12; m++) {
        const SimResult r = simulate({"zb-h2", p, m, 1}, per_stage(p, c.F, c.I, c.W));
        const double each = (p - 1) * (c.F + std::max(0.0, c.I - 2 * std::min(c.F, c.W)));
        EXPECT_NEAR(r.makespan, m * (c.F + c.I + c.W) + each, 1e-9)
            << "F=" << c.F << " I=" << c.I << " W=" << c.W << " p=" << p << " m=" << m;
        for (int j = 0; j < p; j++)
          EXPECT_NEAR(idle(r, j), each, 1e-9) << "F=" << c.F << " I=" << c.I << " W=" << c.W << " p=" << p
                                                << " m=" << m << " j=" << j;
      }
}

TEST(MeasuredHalves, EqualToTheShareWhenTheShareHolds) {
  // Measured halves that are the share w of each backward give the share's timeline.
  for (const char* name : {"zb-h1", "zb-h2"})
    for (double w : {0.2, 0.5, 0.7}) {
      CostModel share{1.0, 2.0, 0.0};
      share.weight_share = w;
      const SimResult a = simulate({name, 4, 8, 1}, share);
      const SimResult b = simulate({name, 4, 8, 1}, per_stage(4, 1.0, 2.0 * (1 - w), 2.0 * w));
      EXPECT_NEAR(a.makespan, b.makespan, 1e-9) << name << " w=" << w;
      EXPECT_NEAR(a.bubble_fraction, b.bubble_fraction, 1e-9) << name << " w=" << w;
    }
  const SimResult a = simulate({"zb-v", 3, 6, 2}, CostModel{1.0, 2.0, 0.0});
  CostModel c = per_stage(6, 0.5, 0.5, 0.5);  // per chunk: half a rank's forward, halves of 1/2
  EXPECT_NEAR(simulate({"zb-v", 3, 6, 2}, c).makespan, a.makespan, 1e-9);
}

TEST(MeasuredHalves, StagesWithTheirOwnHalvesByHand) {
  // zb-h1, p = 2, m = 1: rank 0 F (1); rank 1 F (2) from 1 to 3, I (1) 3 to 4, W (4) 4 to 8; rank 0 I (2) 4 to 6,
  // W (1) 6 to 7. Makespan 8 (rank 1's long weight half), busy 4 + 7. Split in halves instead (1.5 + 1.5,
  // 2.5 + 2.5), rank 0's I would start at 5.5 and end the step at 8.5.
  CostModel c;
  c.stage_forward = {1, 2};
  c.stage_backward = {3, 5};
  c.stage_weight = {1, 4};
  const SimResult r = simulate({"zb-h1", 2, 1, 1}, c);
  EXPECT_DOUBLE_EQ(r.makespan, 8);
  EXPECT_DOUBLE_EQ(r.finish[0], 7);
  EXPECT_DOUBLE_EQ(r.busy, 11);
  ASSERT_EQ(r.boxes[1].size(), 3u);
  EXPECT_DOUBLE_EQ(r.boxes[1][1].end - r.boxes[1][1].start, 1);  // I of stage 1: 5 - 4
  EXPECT_DOUBLE_EQ(r.boxes[1][2].start, 4);
  c.stage_weight.clear();  // back to the assumed share 1/2
  EXPECT_DOUBLE_EQ(simulate({"zb-h1", 2, 1, 1}, c).makespan, 8.5);
}

TEST(MeasuredHalves, RejectsWeightHalvesThatDoNotFit) {
  CostModel c;
  c.stage_forward = {1, 1};
  c.stage_backward = {2, 2};
  c.stage_weight = {1};
  EXPECT_THROW(simulate({"zb-h1", 2, 2, 1}, c), mt::InputError);  // one entry for two stages
  c.stage_weight = {1, 2.5};
  EXPECT_THROW(simulate({"zb-h1", 2, 2, 1}, c), mt::InputError);  // longer than its whole backward
  c.stage_weight = {1, -0.5};
  EXPECT_THROW(simulate({"zb-h1", 2, 2, 1}, c), mt::InputError);
  CostModel uniform;
  uniform.stage_weight = {0.5, 0.5};  // halves without per-stage times
  EXPECT_THROW(simulate({"zb-h1", 2, 2, 1}, uniform), mt::InputError);
}

TEST(MeasuredHalves, BubbleReportUsesEachStagesMeasuredHalves) {
  // zb-h1, p = 2, m = 1, one timed list: rank 0 forward 1 ms, backward 3 ms of which W 1 ms; rank 1 forward 2,
  // backward 5 of which W 4; both spans 10 ms. Through the float packing the trainer gathers with.
  mt::pipeline::PipelineStats r0, r1;
  r0.lists = r1.lists = 1;
  r0.span_us = r1.span_us = 10000;
  r0.forward_us = 1000;
  r0.backward_us = 3000;
  r1.forward_us = 2000;
  r1.backward_us = 5000;
  r0.chunk_forward_us = {1000};
  r0.chunk_backward_us = {3000};
  r0.chunk_weight_us = {1000};
  r1.chunk_forward_us = {2000};
  r1.chunk_backward_us = {5000};
  r1.chunk_weight_us = {4000};
  std::vector<float> buf(mt::plan::packed_size(1));
  mt::plan::pack(r1, 1, buf.data());
  const mt::pipeline::PipelineStats r1b = mt::plan::unpack(buf.data(), 1);
  ASSERT_EQ(r1b.chunk_weight_us.size(), 1u);
  EXPECT_DOUBLE_EQ(r1b.chunk_weight_us[0], 4000);
  const ScheduleSpec spec{"zb-h1", 2, 1, 1};
  const auto rep = mt::plan::bubble_report(spec, {r0, r1b}, false);
  ASSERT_EQ(rep.cost.stage_weight.size(), 2u);
  EXPECT_NEAR(rep.cost.stage_weight[0], 1.0, 1e-6);
  EXPECT_NEAR(rep.cost.stage_weight[1], 4.0, 1e-6);
  EXPECT_NEAR(rep.simulated, 1 - 11.0 / 16.0, 1e-9);             // the timeline by hand above: makespan 8
  EXPECT_NEAR(rep.simulated_half_split, 1 - 11.0 / 17.0, 1e-9);  // halves assumed: 8.5
  EXPECT_NEAR(rep.measured, 1 - 11.0 / 20.0, 1e-9);
  // A schedule without split backward passes takes no weight halves and gives no half-split figure.
  r0.chunk_weight_us = r1.chunk_weight_us = {0};
  const auto one = mt::plan::bubble_report({"1f1b", 2, 1, 1}, {r0, r1}, false);
  EXPECT_TRUE(one.cost.stage_weight.empty());
  EXPECT_DOUBLE_EQ(one.simulated_half_split, -1);
}

}  // namespace
