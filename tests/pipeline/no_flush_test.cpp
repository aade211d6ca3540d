// PipeDream-2BW without a flush (parallel/pipeline/no_flush.h): a window of K steps written out by hand for p = 2,
// m = 2, K = 3; the window equals 1F1B over K m micro-batches when m >= p - 1 and 1F1B's one-step list when K = 1;
// a sweep passes the window checker with 1F1B's activation bound; step t+1's first forward on rank 0 comes before
// (and, replayed, starts before the end of) step t's last backward there; the simulated bubble against 1F1B's
// flushed steps; the checker refuses an update too early, a third weight version, a missing update and a norm
// that deadlocks.
//
// Legend: p stages (ranks), m micro-batches per step, K steps in the window, i = t m + k micro-batch k of step t,
// U(t) the update of step t.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "actions.h"
#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/simulator.h"
#include "plan/window_sim.h"

namespace mt::pipeline {
void PrintTo(const Action& a, std::ostream* os);  // schedule_test.cpp
}  // namespace mt::pipeline

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

ScheduleSpec two_bw(int p, int m) { return {"pipedream-2bw", p, m, 1}; }

// The computations and step updates of a list: "F0 F1 B0 ... U0 ...".
std::string order(const std::vector<Action>& list, int m) {
  std::string s;
  for (const Action& a : list) {
    std::string x;
    if (a.kind == ActionKind::forward) x = "F" + std::to_string(a.micro_batch);
    if (a.kind == ActionKind::backward) x = "B" + std::to_string(a.micro_batch);
    if (a.kind == ActionKind::optimizer_step) x = "U" + std::to_string(a.micro_batch / m);
    if (x.empty()) continue;
    s += (s.empty() ? "" : " ") + x;
  }
  return s;
}

std::string window_error(const ScheduleSpec& spec, int steps, const Schedule& w) {
  try {
    check_no_flush(spec, steps, w);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(passed)";
}

size_t index_of(const std::vector<Action>& list, const Action& a) {
  return (size_t)(std::find(list.begin(), list.end(), a) - list.begin());
}

TEST(NoFlush, TwoStagesTwoMicroBatchesThreeStepsByHand) {
  // Rank 0 (warm-up 1): step 1's F2 runs before step 0's last backward B1, F4 after B3 (the versions rule is
  // met: every backward of step 0 before it); U(0) stands before F4, the first forward of step 2. Rank 1: one
  // forward one backward; U(0) before the wait for F4's input. The last two updates drain the window.
  const Schedule w = no_flush_schedule(two_bw(2, 2), 3);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(order(w[0], 2), "F0 F1 B0 F2 B1 F3 B2 U0 F4 B3 F5 B4 B5 U1 U2");
  EXPECT_EQ(order(w[1], 2), "F0 B0 F1 B1 F2 B2 F3 B3 U0 F4 B4 F5 B5 U1 U2");
  // Rank 1's update sits before the wait (and post) of F4's activation, right after B3's gradient is sent.
  const std::vector<Action>& r1 = w[1];
  const size_t u0 = index_of(r1, step_update(0, 2));
  ASSERT_LT(u0 + 2, r1.size());
  EXPECT_EQ(r1[u0 - 1], SG(3, 0, 0));
  EXPECT_EQ(r1[u0 + 1], WA(4, 0, 0));
  EXPECT_EQ(window_error(two_bw(2, 2), 3, w), "(passed)");
}

TEST(NoFlush, SmallStepsWaitForTheVersionTheyRead) {
  // p = 4, m = 1: 1F1B's warm-up on rank 0 would run F2 (step 2, reads W(1)) before B0 (the last backward of
  // step 0, whose update makes W(1)); the window holds it back until after B0 and U(0).
  const Schedule w = no_flush_schedule(two_bw(4, 1), 4);
  EXPECT_EQ(order(w[0], 1), "F0 F1 B0 U0 F2 B1 U1 F3 B2 B3 U2 U3");
  EXPECT_EQ(window_error(two_bw(4, 1), 4, w), "(passed)");
}

TEST(NoFlush, OneStepIsOneFOneB) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 5, 8}) {
      Schedule w = no_flush_schedule(two_bw(p, m), 1);
      for (auto& list : w.lists) {
        ASSERT_EQ(list.back(), step_update(0, m));
        list.back() = STEP();
      }
      EXPECT_EQ(w.lists, make_schedule({"1f1b", p, m, 1}).lists) << "p = " << p << ", m = " << m;
    }
}

TEST(NoFlush, EnoughMicroBatchesMakeOneFOneBOverTheWindow) {
  // m >= p - 1: the versions rule never binds, and without its updates the window is 1F1B over K m micro-batches.
  for (int p : {2, 3, 4, 8})
    for (int m = p - 1; m <= p + 2; m++)
      for (int K : {2, 3, 5}) {
        if (m < 1) continue;
        EXPECT_EQ(without_step_updates(no_flush_schedule(two_bw(p, m), K)).lists,
                  make_schedule({"1f1b", p, K * m, 1}).lists)
            << "p = " << p << ", m = " << m << ", K = " << K;
      }
}

TEST(NoFlush, SweepPassesTheCheckerWithOneFOneBsActivationBound) {
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 5, 8})
      for (int K : {1, 2, 3, 5}) {
        const Schedule w = no_flush_schedule(two_bw(p, m), K);
        EXPECT_EQ(window_error(two_bw(p, m), K, w), "(passed)") << "p = " << p << ", m = " << m << ", K = " << K;
        for (int j = 0; j < p; j++)
          EXPECT_LE(peak_in_flight(w[j]), std::min(p - j, K * m)) << "p = " << p << ", m = " << m << ", K = " << K;
      }
}

TEST(NoFlush, StepTPlusOnesFirstForwardBeforeStepTsLastBackwardOnRankZero) {
  // The flush is gone: in the list and in the replay (unit costs, F = 1, B = 2).
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const int K = 4;
      const ScheduleSpec spec = two_bw(p, m);
      const Schedule w = no_flush_schedule(spec, K);
      const mt::plan::SimResult r = mt::plan::simulate(window_spec(spec, K), without_step_updates(w), {});
      for (int t = 0; t + 1 < K; t++) {
        const int first = (t + 1) * m, last = (t + 1) * m - 1;  // step t+1's first micro-batch, step t's last
        EXPECT_LT(index_of(w[0], F(first)), index_of(w[0], B(last))) << "p = " << p << ", m = " << m << ", t = " << t;
        double f_start = -1, b_end = -1;
        for (const mt::plan::Box& b : r.boxes[0]) {
          if (b.kind == ActionKind::forward && b.micro_batch == first) f_start = b.start;
          if (b.kind == ActionKind::backward && b.micro_batch == last) b_end = b.end;
        }
        ASSERT_GE(f_start, 0);
        EXPECT_LT(f_start, b_end) << "p = " << p << ", m = " << m << ", t = " << t;
      }
      // And the flushed 1F1B steps do not overlap: its list ends every step with the backwards.
      const Schedule one = make_schedule({"1f1b", p, m, 1});
      EXPECT_EQ(one[0][one[0].size() - 2], B(m - 1));
    }
}

TEST(NoFlush, SimulatedBubbleBelowOneFOneBsFlushedSteps) {
  // F = 1, B = 2, free messages: 1F1B's K flushed steps take K (m + p - 1) 3 units; the window, with m >= p - 1,
  // takes (K m + p - 1) 3: one fill and drain per window instead of one per step, so each further step costs
  // 3 m, the work of a rank (no bubble in steady state).
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const ScheduleSpec spec = two_bw(p, m);
      const double one_step = mt::plan::simulate({"1f1b", p, m, 1}, {}).makespan;
      EXPECT_DOUBLE_EQ(one_step, 3.0 * (m + p - 1));
      double prev = 0;
      for (int K : {1, 2, 3, 4}) {
        const mt::plan::SimResult r =
            mt::plan::simulate(window_spec(spec, K), without_step_updates(no_flush_schedule(spec, K)), {});
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (K * m + p - 1)) << "p = " << p << ", m = " << m << ", K = " << K;
        EXPECT_DOUBLE_EQ(r.bubble_fraction, (p - 1.0) / (K * m + p - 1.0));
        if (K > 1) {
          EXPECT_DOUBLE_EQ(r.makespan - prev, 3.0 * m);  // the steady state: one step's work
          EXPECT_LT(r.makespan, K * one_step);
        }
        prev = r.makespan;
      }
    }
  // m < p - 1 (p = 4, m = 1): the versions rule keeps a bubble, still below the flushed steps'.
  const ScheduleSpec small = two_bw(4, 1);
  const double flushed = 8 * mt::plan::simulate({"1f1b", 4, 1, 1}, {}).makespan;
  const double window = mt::plan::simulate(window_spec(small, 8), without_step_updates(no_flush_schedule(small, 8)), {}).makespan;
  EXPECT_LT(window, flushed);
}

// Moves rank j's update of step t to stand before position `before` of the list (an index in the list without it).
Schedule move_update(Schedule w, int j, int t, int m, size_t before) {
  std::vector<Action>& l = w.lists[j];
  l.erase(l.begin() + (std::ptrdiff_t)index_of(l, step_update(t, m)));
  l.insert(l.begin() + (std::ptrdiff_t)before, step_update(t, m));
  return w;
}

TEST(NoFlush, CheckerRefusesBrokenWindows) {
  const ScheduleSpec spec = two_bw(2, 2);
  const Schedule good = no_flush_schedule(spec, 3);
  // U(0) on rank 0 before B1, the last backward of step 0 there.
  {
    const Schedule w = move_update(good, 0, 0, 2, index_of(good[0], B(1)));
    EXPECT_NE(window_error(spec, 3, w).find("the update of step 0 before the rank's last backward of that step"),
              std::string::npos)
        << window_error(spec, 3, w);
  }
  // U(0) on rank 0 after F4 (step 2 reads W(1), which U(0) makes).
  {
    std::vector<Action> l = good[0];
    l.erase(l.begin() + (std::ptrdiff_t)index_of(l, step_update(0, 2)));
    l.insert(l.begin() + (std::ptrdiff_t)index_of(l, F(4)) + 1, step_update(0, 2));
    Schedule w = good;
    w.lists[0] = l;
    EXPECT_NE(window_error(spec, 3, w).find("a forward of step 2 before the update of step 0"), std::string::npos)
        << window_error(spec, 3, w);
  }
  // No U(2) on rank 1.
  {
    Schedule w = good;
    w.lists[1].pop_back();
    EXPECT_NE(window_error(spec, 3, w).find("rank 1: 2 step updates for a window of 3 steps"), std::string::npos)
        << window_error(spec, 3, w);
  }
  // A step-end update inside a window.
  {
    Schedule w = good;
    w.lists[0].back() = STEP();
    EXPECT_NE(window_error(spec, 3, w).find("a window holds only step updates"), std::string::npos);
  }
  // The norm: rank 1 puts U(0) between B1 and the send of B1's gradient. Every message and every per-rank rule is
  // as before (the list without updates is the good one), but U(0) waits for rank 0's B1, which waits for that
  // gradient.
  {
    const Schedule w = move_update(good, 1, 0, 2, index_of(good[1], SG(1, 0, 0)));
    EXPECT_EQ(without_step_updates(w).lists, without_step_updates(good).lists);
    EXPECT_NE(window_error(spec, 3, w).find("deadlock: rank 0, action"), std::string::npos) << window_error(spec, 3, w);
    EXPECT_NE(window_error(spec, 3, w).find("waits for the norm of step 0"), std::string::npos)
        << window_error(spec, 3, w);
  }
  // A schedule other than pipedream-2bw has no window.
  EXPECT_THROW(no_flush_schedule({"1f1b", 2, 2, 1}, 2), mt::InputError);
  EXPECT_THROW(no_flush_schedule(spec, 0), mt::InputError);
}

}  // namespace

namespace {

using namespace mt::pipeline;

// The window replayed with its updates (plan/window_sim.h).
TEST(NoFlushWindowSim, UpdatesWaitingForTheNormNeverDelayTheWindow) {
  // U(t) stands right before the rank's first forward of step t + 2, which needs (through the activations) rank
  // 0's forward of that micro-batch, after rank 0's last backward of step t, the last one of the step anywhere:
  // the norm is always ready, with free or costly messages and unequal stages.
  std::vector<mt::plan::CostModel> costs(3);
  costs[1].comm = 0.25;
  for (int p : {2, 3, 4}) {
    costs[2].stage_forward.assign(p, 1.0);
    costs[2].stage_backward.assign(p, 2.0);
    costs[2].stage_forward[p - 1] = 1.5;  // the head
    costs[2].stage_backward[0] = 2.5;
    for (int m : {1, 2, p, 2 * p})
      for (const mt::plan::CostModel& cost : costs) {
        const ScheduleSpec spec{"pipedream-2bw", p, m, 1};
        const Schedule w = no_flush_schedule(spec, 4);
        const mt::plan::SimResult with = mt::plan::simulate_window(spec, 4, w, cost, mt::plan::UpdateWait::norm_started);
        const mt::plan::SimResult without = mt::plan::simulate(window_spec(spec, 4), without_step_updates(w), cost);
        EXPECT_DOUBLE_EQ(with.makespan, without.makespan) << "p = " << p << ", m = " << m << ", comm " << cost.comm;
      }
  }
}

}  // namespace

namespace {

using namespace mt::pipeline;

TEST(NoFlushWindowSim, BlockingUpdatesCostAForwardFillEach) {
  // The step's reductions as blocking collectives over all ranks at U(t) (the exchange as it is today): every
  // update inside the window (U(0) .. U(K-3); the last two drain at the end) makes the ranks meet, and the
  // forwards of step t + 2 then fill the pipeline again. With F = 1, B = 2, free messages and m >= p the replay
  // gives (K m + p - 1) 3 + (K - 2)(p - 1): one forward per stage boundary per update, a third of the (p - 1)(F + B)
  // that each flushed 1F1B step idles.
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const int K = 8;
      const ScheduleSpec spec{"pipedream-2bw", p, m, 1};
      const Schedule w = no_flush_schedule(spec, K);
      const mt::plan::SimResult b = mt::plan::simulate_window(spec, K, w, {}, mt::plan::UpdateWait::all_reached);
      EXPECT_DOUBLE_EQ(b.makespan, 3.0 * (K * m + p - 1) + (K - 2) * (p - 1)) << "p = " << p << ", m = " << m;
      EXPECT_LT(b.makespan, K * 3.0 * (m + p - 1));
    }
  // An update's own cost lands on every rank once per step.
  const ScheduleSpec spec{"pipedream-2bw", 2, 2, 1};
  const Schedule w = no_flush_schedule(spec, 3);
  EXPECT_DOUBLE_EQ(mt::plan::simulate_window(spec, 3, w, {}, mt::plan::UpdateWait::norm_started, 0.5).makespan,
                   mt::plan::simulate_window(spec, 3, w, {}, mt::plan::UpdateWait::norm_started).makespan + 1.5);
}

}  // namespace

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

TEST(NoFlushWindowSim, BlockingUpdatesEndOnEveryGeneratedWindow) {
  // U(t) as a collective over all ranks needs every rank to reach it; the generated placement (before the first
  // forward of step t + 2) lets each rank get there without another rank passing its own U(t) first.
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 5, 8})
      for (int K : {1, 2, 3, 5}) {
        const ScheduleSpec spec{"pipedream-2bw", p, m, 1};
        EXPECT_NO_THROW(mt::plan::simulate_window(spec, K, no_flush_schedule(spec, K), {},
                                                  mt::plan::UpdateWait::all_reached))
            << "p = " << p << ", m = " << m << ", K = " << K;
      }
}

TEST(NoFlushWindowSim, AnEarlyUpdateDeadlocksOnlyWhenBlocking) {
  // Rank 1 moves U(0) up to right after B1's gradient is sent (still after its backwards of step 0 and before
  // step 2's forwards: a valid window). Waiting for the norm it ends; as a collective it waits for rank 0, which
  // waits for B2's gradient, which rank 1 computes after U(0).
  const ScheduleSpec spec{"pipedream-2bw", 2, 2, 1};
  Schedule w = no_flush_schedule(spec, 3);
  std::vector<Action>& l = w.lists[1];
  l.erase(std::find(l.begin(), l.end(), step_update(0, 2)));
  l.insert(std::find(l.begin(), l.end(), SG(1, 0, 0)) + 1, step_update(0, 2));
  EXPECT_NO_THROW(check_no_flush(spec, 3, w));
  EXPECT_NO_THROW(mt::plan::simulate_window(spec, 3, w, {}, mt::plan::UpdateWait::norm_started));
  try {
    mt::plan::simulate_window(spec, 3, w, {}, mt::plan::UpdateWait::all_reached);
    ADD_FAILURE() << "no deadlock";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock with blocking updates: rank 0 at action"), std::string::npos)
        << e.what();
  }
}

}  // namespace
