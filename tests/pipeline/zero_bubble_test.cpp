// The zero-bubble schedules zb-h1 and zb-h2 (schedules/zb_h1.cpp, zb_h2.cpp, deferred_weight.cpp): lists written
// out by hand from their rule (1F1B's F and I after a warm-up, W of micro-batch i after I of i + lag), the
// checker over a sweep, the activation bound, the weight halves' ascending order, and the simulator against
// the closed forms with F = B = W = 1 unit (R = 2, weight share 1/2): per rank 1F1B idles (p - 1)(F + B + W),
// zb-h1 (p - 1)(F + B - W), so p = 4, m = 8 gives 9 against 3; zb-h2 reaches the least makespan any schedule
// can, (p - 1)(F + C) + m (F + B + W), also with unequal halves and a message cost C.
//
// Legend: p stages (ranks), m micro-batches, i micro-batch, j rank; F forward, I / W the input and weight
// halves of the backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "actions.h"
#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/simulator.h"

namespace mt::pipeline {
void PrintTo(const Action& a, std::ostream* os);  // schedule_test.cpp
}  // namespace mt::pipeline

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;
using mt::plan::CostModel;
using mt::plan::SimResult;
using mt::plan::simulate;
using mt::plan::theoretical_bubble;
using mt::plan::theoretical_bubble_formula;

std::string summary(const ScheduleSpec& spec, int j) { return compute_summary(make_schedule(spec)[j], 1); }

TEST(ZeroBubble, H1TwoStagesThreeMicroBatchesWholeLists) {
  const Schedule s = make_schedule({"zb-h1", 2, 3, 1});
  ASSERT_EQ(s.size(), 2u);
  // Rank 0: warm-up 1, W right after its I (lag 0). I sends nothing on stage 0; W waits for nothing.
  EXPECT_EQ(s[0], (std::vector<Action>{
                      F(0), SA(0, 0, 1),               // next is F1: nothing to post
                      PG(0, 0, 1), F(1), SA(1, 0, 1),  // next is I0: post its gradient
                      WG(0, 0, 1), I(0),               //
                      W(0),                            // next is F2: nothing to post
                      PG(1, 0, 1), F(2), SA(2, 0, 1),  //
                      WG(1, 0, 1), I(1),               //
                      PG(2, 0, 1), W(1),               // the post for I2 goes out before W1
                      WG(2, 0, 1), I(2),               //
                      W(2), STEP()}));
  // Rank 1 (the last stage): no warm-up, W one micro-batch behind its I (lag 1); I sends the gradient at once.
  EXPECT_EQ(s[1], (std::vector<Action>{
                      PA(0, 0, 0),                     //
                      WA(0, 0, 0), F(0),               //
                      PA(1, 0, 0), I(0), SG(0, 0, 0),  //
                      WA(1, 0, 0), F(1),               //
                      I(1), SG(1, 0, 0),               //
                      PA(2, 0, 0), W(0),               //
                      WA(2, 0, 0), F(2),               //
                      I(2), SG(2, 0, 0),               //
                      W(1), W(2), STEP()}));
}

TEST(ZeroBubble, H1ComputeOrdersFourStages) {
  // Warm-up p - j - 1 forwards; W of i after I of i + j; the W's owed at the end.
  EXPECT_EQ(summary({"zb-h1", 4, 8, 1}, 0), "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7");
  EXPECT_EQ(summary({"zb-h1", 4, 8, 1}, 1), "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7");
  EXPECT_EQ(summary({"zb-h1", 4, 8, 1}, 2), "F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7");
  EXPECT_EQ(summary({"zb-h1", 4, 8, 1}, 3), "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7");
  // Fewer micro-batches than the warm-up wants: capped at m.
  EXPECT_EQ(summary({"zb-h1", 3, 2, 1}, 0), "F0 F1 I0 W0 I1 W1");
  EXPECT_EQ(summary({"zb-h1", 3, 2, 1}, 1), "F0 F1 I0 I1 W0 W1");
  EXPECT_EQ(summary({"zb-h1", 3, 2, 1}, 2), "F0 I0 F1 I1 W0 W1");
}

TEST(ZeroBubble, H2ComputeOrdersFourStages) {
  // Warm-up 2 (p - 1 - j) forwards; W of i after I of i + 2 j.
  EXPECT_EQ(summary({"zb-h2", 4, 8, 1}, 0), "F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7");
  EXPECT_EQ(summary({"zb-h2", 4, 8, 1}, 1), "F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7");
  EXPECT_EQ(summary({"zb-h2", 4, 8, 1}, 2), "F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7");
  EXPECT_EQ(summary({"zb-h2", 4, 8, 1}, 3), "F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7");
  EXPECT_EQ(summary({"zb-h2", 3, 2, 1}, 0), "F0 F1 I0 W0 I1 W1");
  EXPECT_EQ(summary({"zb-h2", 3, 2, 1}, 2), "F0 I0 F1 I1 W0 W1");
}

TEST(ZeroBubble, EveryListIsConsistentAndDeadlockFree) {
  int checked = 0;
  for (const std::string name : {"zb-h1", "zb-h2"})
    for (int p = 1; p <= 6; p++)
      for (int m = 1; m <= 12; m++) {
        const ScheduleSpec spec{name, p, m, 1};
        EXPECT_EQ(check_error(spec, make_schedule(spec)), "(passed)") << name << " p=" << p << " m=" << m;
        checked++;
      }
  EXPECT_EQ(checked, 2 * 6 * 12);
}

TEST(ZeroBubble, ActivationBound) {
  // A micro-batch is held from its F to its W. zb-h1: at most p on every rank, 1F1B's peak (that of its
  // rank 0); zb-h2: at most 2p - 1. Both reach the bound on every rank once m allows it.
  for (int p = 1; p <= 6; p++)
    for (int m = 1; m <= 12; m++) {
      const Schedule h1 = make_schedule({"zb-h1", p, m, 1}), h2 = make_schedule({"zb-h2", p, m, 1});
      const Schedule one = make_schedule({"1f1b", p, m, 1});
      for (int j = 0; j < p; j++) {
        EXPECT_EQ(peak_in_flight(h1[j]), std::min(p, m)) << "p=" << p << " m=" << m << " j=" << j;
        EXPECT_LE(peak_in_flight(h1[j]), peak_in_flight(one[0])) << "p=" << p << " m=" << m << " j=" << j;
        EXPECT_EQ(peak_in_flight(h2[j]), std::min(2 * p - 1, m)) << "p=" << p << " m=" << m << " j=" << j;
      }
    }
}

TEST(ZeroBubble, WeightHalvesAscend) {
  // Every parameter's gradient is summed over micro-batches 0, 1, ..., m - 1 in that order (as in every other
  // schedule): the W's are the halves that add to it.
  for (const std::string name : {"zb-h1", "zb-h2"})
    for (int p = 1; p <= 5; p++)
      for (int m = 1; m <= 9; m++) {
        const Schedule s = make_schedule({name, p, m, 1});
        for (int j = 0; j < p; j++) {
          std::vector<int> order;
          for (const Action& a : s[j])
            if (a.kind == ActionKind::backward_weight) order.push_back(a.micro_batch);
          ASSERT_EQ((int)order.size(), m);
          EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << name << " p=" << p << " m=" << m << " j=" << j;
        }
      }
}

TEST(ZeroBubble, RejectsChunks) {
  for (const std::string name : {"zb-h1", "zb-h2"}) {
    try {
      make_schedule({name, 2, 4, 2});
      ADD_FAILURE() << name << ": no error";
    } catch (const mt::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline schedule " + name + " runs one chunk per rank, got V = 2"),
                std::string::npos)
          << e.what();
    }
  }
}

// ---- The simulator with F = B = W = 1: forward 1, backward 2 split in halves of 1. ----

double idle(const SimResult& r, int j) { return r.makespan - r.busy_per_rank[j]; }

TEST(ZeroBubbleSimulator, ClosedFormsAtFourStagesEightMicroBatches) {
  const CostModel unit{1.0, 2.0, 0.0};
  const SimResult one = simulate({"1f1b", 4, 8, 1}, unit), h1 = simulate({"zb-h1", 4, 8, 1}, unit),
                  h2 = simulate({"zb-h2", 4, 8, 1}, unit);
  for (int j = 0; j < 4; j++) {
    EXPECT_EQ(idle(one, j), 9) << "rank " << j;  // (p - 1)(F + B + W)
    EXPECT_EQ(idle(h1, j), 3) << "rank " << j;   // (p - 1)(F + B - W)
    EXPECT_EQ(idle(h2, j), 3) << "rank " << j;   // the skew of the start, (p - 1) F
  }
  EXPECT_EQ(one.makespan, 33);
  EXPECT_EQ(h1.makespan, 27);
  // The boxes: rank 3 runs F0 at 3, then I0 W... as the list says, each half one unit.
  ASSERT_GE(h1.boxes[3].size(), 3u);
  EXPECT_EQ(h1.boxes[3][0].start, 3);
  EXPECT_EQ(h1.boxes[3][1].kind, ActionKind::backward_input);
  EXPECT_EQ(h1.boxes[3][1].end - h1.boxes[3][1].start, 1);
}

TEST(ZeroBubbleSimulator, H1IdlesPMinusOneUnits) {
  // m >= p: every rank idles p - 1 units, the makespan is 3 m + p - 1 (1F1B: 3 (m + p - 1)).
  const CostModel unit{1.0, 2.0, 0.0};
  for (int p = 1; p <= 6; p++)
    for (int m = p; m <= 12; m++) {
      const SimResult h1 = simulate({"zb-h1", p, m, 1}, unit), one = simulate({"1f1b", p, m, 1}, unit);
      EXPECT_EQ(h1.makespan, 3 * m + p - 1) << "p=" << p << " m=" << m;
      EXPECT_EQ(one.makespan, 3 * (m + p - 1)) << "p=" << p << " m=" << m;
      for (int j = 0; j < p; j++) EXPECT_EQ(idle(h1, j), p - 1) << "p=" << p << " m=" << m << " j=" << j;
    }
}

TEST(ZeroBubbleSimulator, H2ReachesTheLeastMakespan) {
  // No schedule finishes before (p - 1)(F + C) + m (F + B + W): the last rank's first forward waits for p - 1
  // forwards and messages, then it has m (F + B + W) of work. zb-h2 reaches it for m >= 2p - 1 (its warm-up
  // plus one), with equal or unequal halves and with a message cost; zb-h1 does not when the costs are unequal.
  struct Costs {
    double R, w, C;
  };
  for (const Costs c : {Costs{2.0, 0.5, 0.0}, Costs{2.0, 0.35, 0.0}, Costs{2.0, 0.6, 0.0}, Costs{3.0, 1.0 / 3, 0.0},
                        Costs{2.0, 0.5, 0.25}})
    for (int p = 2; p <= 5; p++)
      for (int m = 2 * p - 1; m <= 12; m++) {
        CostModel cost{1.0, c.R, c.C};
        cost.weight_share = c.w;
        const SimResult h2 = simulate({"zb-h2", p, m, 1}, cost);
        const double bound = (p - 1) * (1.0 + c.C) + m * (1.0 + c.R);
        EXPECT_NEAR(h2.makespan, bound, 1e-9) << "R=" << c.R << " w=" << c.w << " C=" << c.C << " p=" << p
                                              << " m=" << m;
        EXPECT_GE(simulate({"zb-h1", p, m, 1}, cost).makespan, bound - 1e-9);
      }
  CostModel skewed{1.0, 2.0, 0.0};
  skewed.weight_share = 0.35;
  EXPECT_GT(simulate({"zb-h1", 4, 8, 1}, skewed).makespan, simulate({"zb-h2", 4, 8, 1}, skewed).makespan);
}

TEST(ZeroBubbleSimulator, RejectsAWeightShareOutsideZeroOne) {
  CostModel c;
  c.weight_share = 1.5;
  EXPECT_THROW(simulate({"zb-h1", 2, 2, 1}, c), mt::InputError);
}

// ---- zb-v: two chunks per rank in a V (rank j: stages j and 2p - 1 - j). ----

std::string summary_v(const ScheduleSpec& spec, int j) { return compute_summary(make_schedule(spec)[j], 2); }

TEST(ZeroBubbleV, PlacementIsAV) {
  const Placement pl = placement_of({"zb-v", 4, 8, 2});
  for (int j = 0; j < 4; j++) {
    EXPECT_EQ(pl.stage_of(j, 0), j);
    EXPECT_EQ(pl.stage_of(j, 1), 7 - j);
  }
  // The turn (stages 3 and 4 on rank 3) is handed over in memory: rank 3 sends its chunk 0's activation to no one.
  const Schedule s = make_schedule({"zb-v", 4, 2, 2});
  for (const Action& a : s[3]) EXPECT_FALSE(a.kind == ActionKind::send_act && a.chunk == 0) << to_string(a);
}

TEST(ZeroBubbleV, ComputeOrderTwoRanksTwoMicroBatches) {
  // The greedy order under unit costs (schedules/zb_v.cpp), worked out by hand: rank 1 holds stages 1 and 2 and
  // turns each micro-batch at once; rank 0 starts the last stage's I0 as soon as F0c1 is done.
  EXPECT_EQ(summary_v({"zb-v", 2, 2, 2}, 0), "F0c0 F1c0 F0c1 I0c1 F1c1 I1c1 I0c0 W0c1 I1c0 W1c1 W0c0 W1c0");
  EXPECT_EQ(summary_v({"zb-v", 2, 2, 2}, 1), "F0c0 F0c1 F1c0 F1c1 I0c1 I0c0 I1c1 I1c0 W0c1 W0c0 W1c1 W1c0");
}

TEST(ZeroBubbleV, ListsAreConsistentBoundedAndAscending) {
  for (int p = 1; p <= 5; p++)
    for (int m = 1; m <= 10; m++) {
      const ScheduleSpec spec{"zb-v", p, m, 2};
      const Schedule s = make_schedule(spec);
      EXPECT_EQ(check_error(spec, s), "(passed)") << "p=" << p << " m=" << m;
      for (int j = 0; j < p; j++) {
        // 1F1B's activation memory: p micro-batches of a whole stage = 2p (micro-batch, chunk) pairs.
        EXPECT_LE(peak_in_flight(s[j]), 2 * p) << "p=" << p << " m=" << m << " j=" << j;
        for (int c = 0; c < 2; c++) {
          std::vector<int> order;
          for (const Action& a : s[j])
            if (a.kind == ActionKind::backward_weight && a.chunk == c) order.push_back(a.micro_batch);
          ASSERT_EQ((int)order.size(), m);
          EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << "p=" << p << " m=" << m << " j=" << j;
        }
      }
    }
}

TEST(ZeroBubbleV, SimulatedNearTheLeastMakespan) {
  // Forward 1 per rank (1/2 per chunk), backward 2 (halves of 1/2 per chunk). No schedule ends before
  // (p - 1) / 2 + 3m: rank p - 1's first forward waits for p - 1 chunk forwards. For m >= p zb-v's list (the
  // shortest of three greedy priority orders) ends at that bound up to p = 4 and within one chunk unit (1/2) of
  // it at p = 5, never behind zb-h1 (which idles p - 1); at p = 4, m = 8 it idles 1.5 units per rank against
  // zb-h1's 3 and 1F1B's 9: 25.5 against 1F1B's 33, 0.773x.
  const CostModel unit{1.0, 2.0, 0.0};
  for (int p = 2; p <= 5; p++)
    for (int m = p; m <= 12; m++) {
      const SimResult r = simulate({"zb-v", p, m, 2}, unit);
      const double bound = (p - 1) / 2.0 + 3.0 * m;
      EXPECT_GE(r.makespan, bound) << "p=" << p << " m=" << m;
      EXPECT_LE(r.makespan, bound + (p <= 4 ? 0.0 : 0.5)) << "p=" << p << " m=" << m;
      EXPECT_LE(r.makespan, simulate({"zb-h1", p, m, 1}, unit).makespan) << "p=" << p << " m=" << m;
    }
  const SimResult v = simulate({"zb-v", 4, 8, 2}, unit);
  EXPECT_EQ(v.makespan, 25.5);
  for (int j = 0; j < 4; j++) EXPECT_EQ(idle(v, j), 1.5) << "rank " << j;
}

TEST(ZeroBubbleV, FewestMessagesOnTheCriticalPathAmongTheShortest) {
  // Of the priority orders whose lists end at 25.5 (p = 4, m = 8), zb-v keeps one with 20 messages on its
  // critical path: with a message latency C small enough not to change the path, the step is 25.5 + 20 C (the
  // first such order tried, I0 I1 F1 F0 W, has 34: 25.5 + 34 C). Worked out by an offline replay of all orders.
  const double C = 1.0 / 128;
  const SimResult r = simulate({"zb-v", 4, 8, 2}, CostModel{1.0, 2.0, C});
  EXPECT_DOUBLE_EQ(r.makespan, 25.5 + 20 * C);
}

TEST(ZeroBubbleSimulator, TheoreticalBubbleIsTheBoundWithTheStepStartingTogether) {
  // theoretical_bubble at F = B = W: the least bubble any list reaches when every rank starts the step together,
  // (p - 1) / (3m + p - 1) for one chunk per rank, (p - 1) / (6m + p - 1) for zb-v's V; zb-h1 equals it from
  // m = p, zb-h2 from m = 2p - 1; nothing is below it. (Before: 1F1B's (p - 1) / (m + p - 1) for all three.)
  const CostModel unit{1.0, 2.0, 0.0};
  for (int p = 2; p <= 5; p++)
    for (int m = 1; m <= 12; m++) {
      const double one_chunk = (p - 1.0) / (3.0 * m + p - 1), v = (p - 1.0) / (6.0 * m + p - 1);
      EXPECT_DOUBLE_EQ(theoretical_bubble({"zb-h1", p, m, 1}), one_chunk);
      EXPECT_DOUBLE_EQ(theoretical_bubble({"zb-h2", p, m, 1}), one_chunk);
      EXPECT_DOUBLE_EQ(theoretical_bubble({"zb-v", p, m, 2}), v);
      const SimResult h1 = simulate({"zb-h1", p, m, 1}, unit), h2 = simulate({"zb-h2", p, m, 1}, unit),
                      zv = simulate({"zb-v", p, m, 2}, unit);
      EXPECT_GE(h1.bubble_fraction, one_chunk - 1e-12) << "p=" << p << " m=" << m;
      EXPECT_GE(h2.bubble_fraction, one_chunk - 1e-12) << "p=" << p << " m=" << m;
      EXPECT_GE(zv.bubble_fraction, v - 1e-12) << "p=" << p << " m=" << m;
      if (m >= p) {
        EXPECT_NEAR(h1.bubble_fraction, one_chunk, 1e-12) << "p=" << p << " m=" << m;
      }
      if (m >= 2 * p - 1) {
        EXPECT_NEAR(h2.bubble_fraction, one_chunk, 1e-12) << "p=" << p << " m=" << m;
      }
    }
  EXPECT_EQ(theoretical_bubble_formula({"zb-v", 4, 8, 2}), "zero-bubble bound (p-1)/(6m+p-1), F = B = W");
  EXPECT_EQ(theoretical_bubble_formula({"zb-h2", 4, 8, 1}), "zero-bubble bound (p-1)/(3m+p-1), F = B = W");
  EXPECT_EQ(theoretical_bubble_formula({"1f1b", 4, 8, 1}), "ideal (p-1)/(m+p-1)");
}

TEST(ZeroBubbleV, RejectsOtherChunkCounts) {
  try {
    make_schedule({"zb-v", 2, 4, 1});
    ADD_FAILURE() << "no error";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline schedule zb-v runs two chunks per rank placed in a V, got V = 1 "
                                         "virtual stages; give --virtual-stages 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
