// PipeDream and PipeMare without a flush (parallel/pipeline/micro_window.h): a window of K steps written out by
// hand for p = 2, m = 2, K = 3; the window is the generator's list over K m micro-batches (1F1B's order with an
// update after every backward) and K = 1 is the one-step list; a sweep passes the window checker, with 1F1B's
// in-flight count min(p - j, K m) on rank j and, under weight stashing, that many weight versions once the window
// is long enough for the steady state (K m >= 2 (p - 1 - j)); step t+1's first forward on rank 0 comes before
// step t's last backward and update there, in the list and in the simulator's replay; the simulated window
// against 1F1B's flushed steps; the checker refuses updates out of order, an update away from its backward and a
// missing update.
//
// Legend: p stages (ranks), m micro-batches per step, K steps in the window, n = t m + k micro-batch k of step t,
// U(n) the update after micro-batch n's backward.
#include "parallel/pipeline/micro_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "actions.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "plan/simulator.h"
#include "plan/window_sim.h"

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

ScheduleSpec pipedream(int p, int m) { return {"pipedream", p, m, 1}; }
Action U(int n) { return {ActionKind::optimizer_step, n, 0, -1}; }

// The computations and updates of a list: "F0 F1 B0 U0 ...".
std::string order(const std::vector<Action>& list) {
  std::string s;
  for (const Action& a : list) {
    std::string x;
    if (a.kind == ActionKind::forward) x = "F" + std::to_string(a.micro_batch);
    if (a.kind == ActionKind::backward) x = "B" + std::to_string(a.micro_batch);
    if (a.kind == ActionKind::optimizer_step) x = "U" + std::to_string(a.micro_batch);
    if (x.empty()) continue;
    s += (s.empty() ? "" : " ") + x;
  }
  return s;
}

std::string window_error(const ScheduleSpec& spec, int steps, const Schedule& w) {
  try {
    check_micro_window(spec, steps, w);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(passed)";
}

size_t index_of(const std::vector<Action>& list, const Action& a) {
  return (size_t)(std::find(list.begin(), list.end(), a) - list.begin());
}

TEST(MicroWindow, TwoStagesTwoMicroBatchesThreeStepsByHand) {
  // Rank 0 (warm-up 1): step 1's F2 runs before step 0's last backward B1 and its update U1; no step boundary.
  const Schedule w = micro_window_schedule(pipedream(2, 2), 3);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(order(w[0]), "F0 F1 B0 U0 F2 B1 U1 F3 B2 U2 F4 B3 U3 F5 B4 U4 B5 U5");
  EXPECT_EQ(order(w[1]), "F0 B0 U0 F1 B1 U1 F2 B2 U2 F3 B3 U3 F4 B4 U4 F5 B5 U5");
  // Rank 1's update stands right after B0's gradient is sent.
  const size_t u0 = index_of(w[1], U(0));
  ASSERT_GT(u0, 1u);
  EXPECT_EQ(w[1][u0 - 1], SG(0, 0, 0));
  EXPECT_EQ(w[1][u0 - 2], B(0));
  EXPECT_EQ(window_error(pipedream(2, 2), 3, w), "(passed)");
}

TEST(MicroWindow, OneStepIsTheFlushedList) {
  for (const char* name : {"pipedream", "pipemare"})
    for (int p : {2, 3, 4})
      for (int m : {1, 2, 3, 5}) {
        const ScheduleSpec spec{name, p, m, 1};
        EXPECT_EQ(micro_window_schedule(spec, 1).lists, make_schedule(spec).lists) << name << " p " << p << " m " << m;
      }
}

TEST(MicroWindow, SweepPassesTheCheckerWithOneFOneBsInFlightCountAndStash) {
  for (const char* name : {"pipedream", "pipemare"})
    for (int p : {2, 3, 4, 5, 8})
      for (int m : {1, 2, 3, 4, 8})
        for (int K : {1, 2, 3, 5}) {
          const ScheduleSpec spec{name, p, m, 1};
          const Schedule w = micro_window_schedule(spec, K);
          const std::string at =
              std::string(name) + " p " + std::to_string(p) + " m " + std::to_string(m) + " K " + std::to_string(K);
          EXPECT_EQ(window_error(spec, K, w), "(passed)") << at;
          const std::vector<int> flying = in_flight_counts(w), stash = stash_depths(w, true),
                                 newest = stash_depths(w, false);
          for (int j = 0; j < p; j++) {
            EXPECT_EQ(flying[j], std::min(p - j, K * m)) << at << " rank " << j;
            EXPECT_LE(stash[j], flying[j]) << at << " rank " << j;
            if (K * m >= 2 * (p - 1 - j)) {
              EXPECT_EQ(stash[j], flying[j]) << at << " rank " << j;
            }
            EXPECT_EQ(newest[j], 1) << at << " rank " << j;
          }
        }
}

TEST(MicroWindow, StashBelowTheInFlightCountWhenTheWindowIsShort) {
  // p = 4, m = 2, K = 1 (the flushed step): rank 0's three warm-up forwards all read version 0, so it holds
  // 2 versions, not 4; a window of 3 steps reaches 4.
  EXPECT_EQ(stash_depths(micro_window_schedule(pipedream(4, 2), 1), true), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(stash_depths(micro_window_schedule(pipedream(4, 2), 3), true), (std::vector<int>{4, 3, 2, 1}));
}

TEST(MicroWindow, StepTPlusOnesFirstForwardBeforeStepTsLastUpdateOnRankZero) {
  // The flush is gone: in the list and in the replay (unit costs, F = 1, B = 2, updates free).
  for (const char* name : {"pipedream", "pipemare"})
    for (int p : {2, 4})
      for (int m : {p, 2 * p}) {
        const int K = 4;
        const ScheduleSpec spec{name, p, m, 1};
        const Schedule w = micro_window_schedule(spec, K);
        const mt::plan::SimResult r = mt::plan::simulate(window_spec(spec, K), w, {});
        for (int t = 0; t + 1 < K; t++) {
          const int first = (t + 1) * m, last = (t + 1) * m - 1;  // step t+1's first micro-batch, step t's last
          EXPECT_LT(index_of(w[0], F(first)), index_of(w[0], U(last)))
              << name << " p " << p << " m " << m << " t " << t;
          double f_start = -1, b_end = -1;
          for (const mt::plan::Box& b : r.boxes[0]) {
            if (b.kind == ActionKind::forward && b.micro_batch == first) f_start = b.start;
            if (b.kind == ActionKind::backward && b.micro_batch == last) b_end = b.end;
          }
          ASSERT_GE(f_start, 0);
          EXPECT_LT(f_start, b_end) << name << " p " << p << " m " << m << " t " << t;
        }
      }
}

TEST(MicroWindow, SimulatedWindowAgainstOneFOneBsFlushedSteps) {
  // F = 1, B = 2, free messages and updates: 1F1B's K flushed steps take K (m + p - 1) 3 units, the window
  // (K m + p - 1) 3: one fill and drain per window, so each further step costs 3 m (no bubble in steady state).
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const ScheduleSpec spec = pipedream(p, m);
      const double one_step = mt::plan::simulate({"1f1b", p, m, 1}, {}).makespan;
      EXPECT_DOUBLE_EQ(one_step, 3.0 * (m + p - 1));
      for (int K : {1, 2, 4}) {
        const mt::plan::SimResult r = mt::plan::simulate(window_spec(spec, K), micro_window_schedule(spec, K), {});
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (K * m + p - 1)) << "p " << p << " m " << m << " K " << K;
        EXPECT_DOUBLE_EQ(r.bubble_fraction, (p - 1.0) / (K * m + p - 1.0));
        if (K > 1) {
          EXPECT_LT(r.makespan, K * one_step);
        }
      }
    }
}

TEST(MicroWindow, CheckerRefusesBrokenWindows) {
  const ScheduleSpec spec = pipedream(2, 2);
  const Schedule good = micro_window_schedule(spec, 3);
  auto error_of = [&](const Schedule& w) { return window_error(spec, 3, w); };
  // U(3) and U(4) swapped on rank 0, both after B4 (check_schedule alone passes it: each after its backward).
  {
    Schedule w = good;
    std::vector<Action>& l = w.lists[0];
    l.erase(l.begin() + (std::ptrdiff_t)index_of(l, U(3)));
    l.insert(l.begin() + (std::ptrdiff_t)index_of(l, U(4)) + 1, U(3));
    EXPECT_EQ(check_error(window_spec(spec, 3), w), "(passed)");
    EXPECT_NE(error_of(w).find("expected the update of micro-batch 3"), std::string::npos) << error_of(w);
  }
  // U(0) on rank 0 moved after F2: not right after its backward.
  {
    Schedule w = good;
    std::vector<Action>& l = w.lists[0];
    l.erase(l.begin() + (std::ptrdiff_t)index_of(l, U(0)));
    l.insert(l.begin() + (std::ptrdiff_t)index_of(l, F(2)) + 1, U(0));
    EXPECT_EQ(check_error(window_spec(spec, 3), w), "(passed)");
    EXPECT_NE(error_of(w).find("not right after the backward of micro-batch 0"), std::string::npos) << error_of(w);
  }
  // U(4) missing on rank 1.
  {
    Schedule w = good;
    w.lists[1].erase(w.lists[1].begin() + (std::ptrdiff_t)index_of(w[1], U(4)));
    EXPECT_NE(error_of(w).find("no optimizer_step after its backward"), std::string::npos) << error_of(w);
  }
  // A window of 2bw's step updates is not one of per-micro-batch updates.
  EXPECT_NE(window_error(spec, 3, no_flush_schedule({"pipedream-2bw", 2, 2, 1}, 3)), "(passed)");
}

}  // namespace

namespace {

using namespace mt::pipeline;

TEST(MicroWindowSim, BlockingPerMicroBatchUpdatesCostPMinusOneBackwardsEach) {
  // F = 1, B = 2, free messages: with every U(n) a collective over the stages, the last stage's forward of n+1
  // waits for stage 0's backward of n, (p - 1) B after its own; in steady state each micro-batch then takes
  // F + p B on every rank (5 at p = 2, 9 at p = 4) against 1F1B's F + B of work: one more step adds m (F + p B).
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const ScheduleSpec spec{"pipedream", p, m, 1};
      const double k3 = mt::plan::simulate_micro_window(spec, 3, micro_window_schedule(spec, 3), {}).makespan;
      const double k4 = mt::plan::simulate_micro_window(spec, 4, micro_window_schedule(spec, 4), {}).makespan;
      EXPECT_DOUBLE_EQ(k4 - k3, m * (1.0 + 2.0 * p)) << "p " << p << " m " << m;
      // Free updates would not change the list's replay without them (no wait at all).
      EXPECT_LT(mt::plan::simulate(window_spec(spec, 4), micro_window_schedule(spec, 4), {}).makespan, k4);
    }
}

}  // namespace
