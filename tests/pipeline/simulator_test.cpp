// The pipeline simulator (plan/simulator.h): the utilization figures of DESIGN.md, the bubble formula over a
// sweep, interleaved's smaller bubble, and a few timelines worked out by hand. With F = 1 and R = 1, 2 or 3
// every time is a small integer (or a half), so the comparisons are exact.
//
// Legend: p stages (ranks), m micro-batches, V chunks per rank, R backward / forward, C message cost.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/simulator.h"

namespace {

using mt::pipeline::ActionKind;
using mt::pipeline::ScheduleSpec;
using mt::plan::CostModel;
using mt::plan::SimResult;
using mt::plan::simulate;

TEST(Simulator, GpipeUtilizationFromTheDesign) {
  // p = 4, backward twice forward: a micro-batch is 3 cells per stage; the makespan is (m + p - 1) * 3.
  const CostModel cost{1.0, 2.0, 0.0};
  SimResult r1 = simulate({"gpipe", 4, 1, 1}, cost);
  EXPECT_EQ(r1.busy, 12);
  EXPECT_EQ(4 * r1.makespan, 48);
  EXPECT_DOUBLE_EQ(r1.utilization, 0.25);

  SimResult r4 = simulate({"gpipe", 4, 4, 1}, cost);
  EXPECT_EQ(r4.busy, 48);
  EXPECT_EQ(4 * r4.makespan, 84);
  EXPECT_DOUBLE_EQ(r4.utilization, 48.0 / 84.0);
  EXPECT_EQ(std::to_string(r4.utilization * 100).substr(0, 4), "57.1");

  SimResult r8 = simulate({"gpipe", 4, 8, 1}, cost);
  EXPECT_EQ(r8.busy, 96);
  EXPECT_EQ(4 * r8.makespan, 132);
  EXPECT_DOUBLE_EQ(r8.utilization, 96.0 / 132.0);
  EXPECT_EQ(std::to_string(r8.utilization * 100).substr(0, 4), "72.7");
}

TEST(Simulator, BubbleIsPMinusOneOverMPlusPMinusOne) {
  for (const std::string name : {"gpipe", "1f1b"}) {
    for (double R : {1.0, 2.0, 3.0}) {
      for (int p = 1; p <= 4; p++) {
        for (int m = 1; m <= 9; m++) {
          const SimResult r = simulate({name, p, m, 1}, CostModel{1.0, R, 0.0});
          EXPECT_DOUBLE_EQ(r.bubble_fraction, double(p - 1) / (m + p - 1))
              << name << " R=" << R << " p=" << p << " m=" << m;
          EXPECT_EQ(r.makespan, (m + p - 1) * (1 + R)) << name << " R=" << R << " p=" << p << " m=" << m;
        }
      }
    }
  }
}

TEST(Simulator, InterleavedBubbleIsPMinusOneOverVmPlusPMinusOne) {
  // One chunk's forward takes F / V. Megatron-LM's estimate (p - 1) / (V m + p - 1) comes out exactly here
  // (measured: p = 4, m = 8: V = 2 15.8%, V = 3 11.1%, against 27.3% for 1f1b).
  for (int p = 2; p <= 4; p++) {
    for (int V = 2; V <= 3; V++) {
      for (int m = p; m <= 9; m += p) {
        const ScheduleSpec spec{"interleaved", p, m, V};
        const SimResult r = simulate(spec);
        EXPECT_NEAR(r.bubble_fraction, mt::plan::theoretical_bubble(spec), 1e-12) << "p=" << p << " m=" << m
                                                                                   << " V=" << V;
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (V * m + p - 1), 1e-12);
        EXPECT_LT(r.bubble_fraction, simulate({"1f1b", p, m, 1}).bubble_fraction);
        EXPECT_NEAR(r.busy, p * m * 3.0, 1e-9);  // the same work as 1f1b, in smaller pieces
      }
    }
  }
  EXPECT_NEAR(simulate({"interleaved", 4, 8, 2}).bubble_fraction, 3.0 / 19, 1e-12);
  EXPECT_NEAR(simulate({"interleaved", 4, 8, 3}).bubble_fraction, 3.0 / 27, 1e-12);
}

struct Expected {
  double start, end;
  ActionKind kind;
  int i;
};

void expect_boxes(const SimResult& r, int j, const std::vector<Expected>& want) {
  ASSERT_EQ(r.boxes[j].size(), want.size()) << "rank " << j;
  for (size_t n = 0; n < want.size(); n++) {
    const auto& b = r.boxes[j][n];
    EXPECT_EQ(b.start, want[n].start) << "rank " << j << " box " << n;
    EXPECT_EQ(b.end, want[n].end) << "rank " << j << " box " << n;
    EXPECT_EQ(b.kind, want[n].kind) << "rank " << j << " box " << n;
    EXPECT_EQ(b.micro_batch, want[n].i) << "rank " << j << " box " << n;
  }
}

TEST(Simulator, OneFOneBTimelineByHand) {
  // p = 2, m = 3, R = 2. Rank 1 runs F0 B0 at 1..4; rank 0's B0 waits for that gradient (4), so rank 0
  // idles 2..4, then B0 F2 until 7; rank 1's F1 could start at 2 but follows B0: 4..5, B1 5..7; and so on.
  const SimResult r = simulate({"1f1b", 2, 3, 1});
  constexpr ActionKind F = ActionKind::forward, B = ActionKind::backward;
  expect_boxes(r, 0, {{0, 1, F, 0}, {1, 2, F, 1}, {4, 6, B, 0}, {6, 7, F, 2}, {7, 9, B, 1}, {10, 12, B, 2}});
  expect_boxes(r, 1, {{1, 2, F, 0}, {2, 4, B, 0}, {4, 5, F, 1}, {5, 7, B, 1}, {7, 8, F, 2}, {8, 10, B, 2}});
  EXPECT_EQ(r.makespan, 12);
  EXPECT_EQ(r.finish, (std::vector<double>{12, 10}));
  EXPECT_EQ(r.busy_per_rank, (std::vector<double>{9, 9}));
}

TEST(Simulator, MessageCostDelaysEachHop) {
  // GPipe p = 2, m = 1, C = 0.5: F0 on rank 0 0..1, activation arrives 1.5, rank 1 runs F0 1.5..2.5 and B0
  // 2.5..4.5, the gradient arrives 5, rank 0 runs B0 5..7.
  const SimResult r = simulate({"gpipe", 2, 1, 1}, CostModel{1.0, 2.0, 0.5});
  constexpr ActionKind F = ActionKind::forward, B = ActionKind::backward;
  expect_boxes(r, 0, {{0, 1, F, 0}, {5, 7, B, 0}});
  expect_boxes(r, 1, {{1.5, 2.5, F, 0}, {2.5, 4.5, B, 0}});
  EXPECT_EQ(r.makespan, 7);
  EXPECT_DOUBLE_EQ(r.utilization, 6.0 / 14.0);
}

TEST(Simulator, ReceivePostedLateDelaysTheTransfer) {
  // A message moves once it is both sent and posted (rendezvous). GPipe p = 2, m = 2, C = 1, rank 1's list:
  // post(act 0), wait(act 0), post(act 1), F0, wait(act 1), F1, ... Activation 1 is sent at 2 but its
  // receive is posted when F0 starts (2), so it arrives at 3 and F1 runs 3..4 right after F0 (2..3).
  const SimResult r = simulate({"gpipe", 2, 2, 1}, CostModel{1.0, 2.0, 1.0});
  EXPECT_EQ(r.boxes[1][0].start, 2);
  EXPECT_EQ(r.boxes[1][1].start, 3);
  // Posting after the send: the same list with rank 1's second post moved behind F0 delays F1 to 4.
  const ScheduleSpec spec{"gpipe", 2, 2, 1};
  auto s = mt::pipeline::make_schedule(spec);
  auto& l = s[1];
  ASSERT_EQ(l[2].kind, ActionKind::post_recv_act);
  ASSERT_EQ(l[3].kind, ActionKind::forward);
  std::swap(l[2], l[3]);
  const SimResult late = simulate(spec, s, CostModel{1.0, 2.0, 1.0});
  EXPECT_EQ(late.boxes[1][1].start, 4);
}

TEST(Simulator, SendsAndPostsOccupyTheirRank) {
  // 1F1B p = 2, m = 1 with a send taking s = 0.25, a post q = 0.125 and messages C = 0.5 (F 1, B 2), by hand:
  // rank 0 posts its gradient receive 0..q, runs F0 q..q+1, sends q+1..q+1+s (issued at its end);
  // rank 1 posts 0..q, the activation arrives q+1+s+C = 1.875: F0 1.875..2.875, B0 ..4.875, sends ..5.125;
  // the gradient arrives 5.625 and rank 0 runs B0 5.625..7.625: makespan 6 + q + 2s + 2C. Busy time is compute
  // only (6 of 2 x 7.625): a send's and a post's time is bubble, as in the executor's measured bubble.
  CostModel c{1.0, 2.0, 0.5};
  c.send = 0.25;
  c.post = 0.125;
  const SimResult r = simulate({"1f1b", 2, 1, 1}, c);
  constexpr ActionKind F = ActionKind::forward, B = ActionKind::backward;
  expect_boxes(r, 0, {{0.125, 1.125, F, 0}, {5.625, 7.625, B, 0}});
  expect_boxes(r, 1, {{1.875, 2.875, F, 0}, {2.875, 4.875, B, 0}});
  EXPECT_DOUBLE_EQ(r.makespan, 7.625);
  EXPECT_DOUBLE_EQ(r.finish[1], 5.125);
  EXPECT_DOUBLE_EQ(r.utilization, 6.0 / (2 * 7.625));
  c.send = -1;
  EXPECT_THROW(simulate({"1f1b", 2, 1, 1}, c), mt::InputError);
}

TEST(Simulator, RejectsBadCostsAndBrokenLists) {
  EXPECT_THROW(simulate({"gpipe", 2, 2, 1}, CostModel{0.0, 2.0, 0.0}), mt::InputError);
  EXPECT_THROW(simulate({"gpipe", 2, 2, 1}, CostModel{1.0, -1.0, 0.0}), mt::InputError);
  EXPECT_THROW(simulate({"gpipe", 2, 2, 1}, CostModel{1.0, 2.0, -0.5}), mt::InputError);
  const ScheduleSpec spec{"gpipe", 2, 2, 1};
  auto s = mt::pipeline::make_schedule(spec);
  s[1].pop_back();
  EXPECT_THROW(simulate(spec, s, CostModel{}), mt::pipeline::ScheduleError);
}

}  // namespace
