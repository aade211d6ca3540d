// Synchronous one-chunk schedules back to back (parallel/pipeline/sync_window.h, plan/sync_window_sim.h): the window
// is each rank's one-step list per step with U(t) between (by hand for 1f1b, p = 2, m = 2, K = 3); a sweep passes
// the checker; the checker refuses an update before one of its step's W, a forward of step t + 1 before U(t), a
// missing or misordered update and a stray step-end update; the replay against closed forms: under the local rule
// zb-h2 steps at m (F + B + W) (zero bubble) and step t + 1's first forward on rank 0 starts before step t's last
// W on rank p - 1 ends; under the norm rule (chain or blocking) no list steps faster than (p - 1) F + m (F + B + W)
// and zb-h2 reaches exactly that, and the same holds when only the tied embedding's two copies (first and last
// stage) wait for each other; 1F1B gains nothing under any rule.
//
// Legend: p stages (ranks), m micro-batches per step, K steps in the window, i = t m + k micro-batch k of step t,
// U(t) the update of step t; F = 1, B = 2 (halves I = W = 1), message cost C.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "actions.h"
#include "core/error.h"
#include "parallel/pipeline/no_flush.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/sync_window.h"
#include "plan/sync_window_sim.h"

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;
using mt::plan::CostModel;
using mt::plan::StepUpdateWait;

const char* const kNames[] = {"1f1b", "zb-h1", "zb-h2"};

Action U(int t, int m) { return step_update(t, m); }

std::string window_error(const ScheduleSpec& spec, int steps, const Schedule& w) {
  try {
    check_sync_window(spec, steps, w);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(passed)";
}

size_t index_of(const std::vector<Action>& list, const Action& a) {
  const auto it = std::find(list.begin(), list.end(), a);
  EXPECT_NE(it, list.end()) << to_string(a);
  return (size_t)(it - list.begin());
}

// Moves the action at index from to stand right before index to (to < from) or right after it (to > from).
void move(std::vector<Action>& list, size_t from, size_t to) {
  const Action a = list[from];
  list.erase(list.begin() + (std::ptrdiff_t)from);
  list.insert(list.begin() + (std::ptrdiff_t)to, a);
}

TEST(SyncWindow, OneFOneBTwoStagesTwoMicroBatchesThreeStepsByHand) {
  const ScheduleSpec spec{"1f1b", 2, 2, 1};
  const Schedule w = sync_window_schedule(spec, 3);
  ASSERT_EQ(w.size(), 2u);
  // Rank 0: F0 F1 B0 B1 per step (warm-up 1), rank 1: F0 B0 F1 B1; micro-batches 2 t, 2 t + 1.
  std::vector<Action> r0, r1;
  for (int t = 0; t < 3; t++) {
    const int a = 2 * t, b = 2 * t + 1;
    for (const Action& x : {F(a), SA(a, 0, 1), PG(a, 0, 1), F(b), SA(b, 0, 1), WG(a, 0, 1), PG(b, 0, 1), B(a),
                            WG(b, 0, 1), B(b), U(t, 2)})
      r0.push_back(x);
    for (const Action& x : {PA(a, 0, 0), WA(a, 0, 0), F(a), B(a), SG(a, 0, 0), PA(b, 0, 0), WA(b, 0, 0), F(b), B(b),
                            SG(b, 0, 0), U(t, 2)})
      r1.push_back(x);
  }
  // Only the computations' and updates' order is the rule; the messages are schedule.h's, compared as generated
  // against the one-step list renumbered.
  auto compute_and_updates = [](const std::vector<Action>& l) {
    std::vector<Action> out;
    for (const Action& a : l)
      if (is_compute(a.kind) || a.kind == ActionKind::optimizer_step) out.push_back(a);
    return out;
  };
  EXPECT_EQ(compute_and_updates(w[0]), compute_and_updates(r0));
  EXPECT_EQ(compute_and_updates(w[1]), compute_and_updates(r1));
  EXPECT_EQ(window_error(spec, 3, w), "(passed)");
}

TEST(SyncWindow, OneStepIsTheOneStepListWithItsUpdateNumbered) {
  for (const char* name : kNames) {
    const ScheduleSpec spec{name, 4, 8, 1};
    const Schedule one = make_schedule(spec), w = sync_window_schedule(spec, 1);
    for (int j = 0; j < 4; j++) {
      std::vector<Action> expect = one[j];
      expect.back() = U(0, 8);
      EXPECT_EQ(w[j], expect) << name << " rank " << j;
    }
  }
}

TEST(SyncWindow, SweepPassesTheChecker) {
  for (const char* name : kNames)
    for (int p = 1; p <= 5; p++)
      for (int m = 1; m <= 9; m++)
        for (int K : {1, 2, 3}) {
          const ScheduleSpec spec{name, p, m, 1};
          EXPECT_EQ(window_error(spec, K, sync_window_schedule(spec, K)), "(passed)") << name << " p=" << p << " m=" << m
                                                                                      << " K=" << K;
        }
}

TEST(SyncWindow, OtherSchedulesAreRefusedByName) {
  std::string why;
  EXPECT_FALSE(sync_window_applies({"zb-v", 2, 4, 2}, &why));
  EXPECT_NE(why.find("zb-v"), std::string::npos) << why;
  EXPECT_FALSE(sync_window_applies({"interleaved", 2, 4, 2}));
  EXPECT_FALSE(sync_window_applies({"pipedream-2bw", 2, 4, 1}));
  EXPECT_TRUE(sync_window_applies({"zb-h2", 2, 4, 1}));
  EXPECT_THROW(sync_window_schedule({"chimera", 2, 4, 1}, 2), mt::InputError);
  EXPECT_THROW(sync_window_schedule({"1f1b", 2, 4, 1}, 0), mt::InputError);
}

TEST(SyncWindow, CheckerRefusesBrokenWindows) {
  const ScheduleSpec spec{"zb-h2", 4, 8, 1};
  const Schedule good = sync_window_schedule(spec, 3);
  ASSERT_EQ(window_error(spec, 3, good), "(passed)");
  {  // U(0) on rank 3 before its last W of step 0 (W7: zb-h2 defers rank 3's W's to the end of its step)
    Schedule w = good;
    const size_t u = index_of(w[3], U(0, 8)), last_w = index_of(w[3], W(7));
    move(w[3], u, last_w);
    EXPECT_NE(window_error(spec, 3, w).find("after the update of step 0"), std::string::npos) << window_error(spec, 3, w);
  }
  {  // rank 0's first forward of step 1 (F8) before U(0)
    Schedule w = good;
    const size_t f = index_of(w[0], F(8)), u = index_of(w[0], U(0, 8));
    move(w[0], f, u);
    EXPECT_NE(window_error(spec, 3, w).find("before the update of step 0"), std::string::npos) << window_error(spec, 3, w);
  }
  {  // U(1) missing on rank 2
    Schedule w = good;
    w[2].erase(w[2].begin() + (std::ptrdiff_t)index_of(w[2], U(1, 8)));
    EXPECT_NE(window_error(spec, 3, w), "(passed)");
  }
  {  // a step-end update of the one-step kind inside the window
    Schedule w = good;
    w[1].insert(w[1].begin() + 3, Action{ActionKind::optimizer_step, -1, -1, -1});
    EXPECT_NE(window_error(spec, 3, w).find("only step updates"), std::string::npos) << window_error(spec, 3, w);
  }
  {  // U(0) and U(1) numbered the other way round
    Schedule w = good;
    std::swap(w[0][index_of(w[0], U(0, 8))], w[0][index_of(w[0], U(1, 8))]);
    EXPECT_NE(window_error(spec, 3, w).find("expected the update of step 0"), std::string::npos)
        << window_error(spec, 3, w);
  }
}

CostModel unit(double comm = 0) {
  CostModel c;
  c.forward = 1;
  c.backward_ratio = 2;
  c.weight_share = 0.5;
  c.comm = comm;
  return c;
}

double step_time(const char* name, int p, int m, StepUpdateWait wait, double comm = 0, int K = 5) {
  const ScheduleSpec spec{name, p, m, 1};
  return mt::plan::simulate_sync_window(spec, K, sync_window_schedule(spec, K), unit(comm), wait).step();
}

TEST(SyncWindowSim, ZbH2LocalUpdatesStepAtZeroBubble) {
  // p = 4, m = 8: every rank has m (F + B + W) = 24 units per step; no idle in the steady state.
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 4, 8, StepUpdateWait::local), 24.0);
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 2, 4, StepUpdateWait::local), 12.0);
}

TEST(SyncWindowSim, TheNormRuleBoundsEveryListAtTheSynchronizedStep) {
  // (p - 1) F + m (F + B + W): zb-h2 reaches it at m >= 2p - 1 (27 units at p = 4, m = 8, against 1F1B's 33).
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 4, 8, StepUpdateWait::norm_chain), 27.0);
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 4, 8, StepUpdateWait::blocking), 27.0);
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 4, 8, StepUpdateWait::tied_ends), 27.0);
  for (const char* name : kNames)
    for (int p = 2; p <= 5; p++)
      for (int m = 1; m <= 10; m++) {
        const double bound = (p - 1) + 3.0 * m;
        const double chain = step_time(name, p, m, StepUpdateWait::norm_chain);
        EXPECT_GE(chain, bound - 1e-9) << name << " p=" << p << " m=" << m;
        // With free messages the chain's norm is ready exactly when the last rank reaches U(t): the blocking time.
        EXPECT_DOUBLE_EQ(chain, step_time(name, p, m, StepUpdateWait::blocking)) << name << " p=" << p << " m=" << m;
        EXPECT_GE(step_time(name, p, m, StepUpdateWait::local), 3.0 * m - 1e-9) << name << " p=" << p << " m=" << m;
        // The tied embedding alone (no norm) makes rank 0 wait for rank p - 1's last W: the same bound.
        EXPECT_GE(step_time(name, p, m, StepUpdateWait::tied_ends), bound - 1e-9) << name << " p=" << p << " m=" << m;
      }
}

TEST(SyncWindowSim, TheBoundHoldsWithUnequalHalvesAndMessages) {
  // The bound does not depend on how the backward splits: rank p - 1 has m (F + B) per step and starts p - 1
  // forwards (and messages) after rank 0's update. w = 0.3, 0.7; C = 0, 0.2.
  for (double w : {0.3, 0.7})
    for (double C : {0.0, 0.2})
      for (const char* name : kNames)
        for (int p = 2; p <= 4; p++)
          for (int m : {p, 2 * p}) {
            const ScheduleSpec spec{name, p, m, 1};
            CostModel c = unit(C);
            c.weight_share = w;
            const Schedule win = sync_window_schedule(spec, 4);
            const double bound = (p - 1) * (1 + C) + 3.0 * m;
            for (StepUpdateWait rule : {StepUpdateWait::norm_chain, StepUpdateWait::blocking, StepUpdateWait::tied_ends})
              EXPECT_GE(mt::plan::simulate_sync_window(spec, 4, win, c, rule).step(), bound - 1e-9)
                  << name << " p=" << p << " m=" << m << " w=" << w << " C=" << C << " rule " << (int)rule;
          }
}

TEST(SyncWindowSim, TheTieWithWteComputedEarlyCostsNothing) {
  // If the last stage's wte gradient came with its input half, rank 0 would wait only for rank p - 1's last I, which
  // is done before rank 0's own: zb-h2 steps at m (F + B + W) = 24 at p = 4, m = 8 (the least any rank's work
  // allows), 12 at p = 2, m = 4.
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 4, 8, StepUpdateWait::tied_wte_early), 24.0);
  EXPECT_DOUBLE_EQ(step_time("zb-h2", 2, 4, StepUpdateWait::tied_wte_early), 12.0);
}

TEST(SyncWindowSim, OneFOneBGainsNothingBackToBack) {
  // Rank 0 runs 1F1B's last backward of every step, so its update waits for nobody: (m + p - 1)(F + B) either way.
  for (StepUpdateWait wait : {StepUpdateWait::local, StepUpdateWait::norm_chain, StepUpdateWait::blocking,
                              StepUpdateWait::tied_ends})
    EXPECT_DOUBLE_EQ(step_time("1f1b", 4, 8, wait), 33.0);
}

TEST(SyncWindowSim, TheChainAddsItsMessagesToTheStep) {
  // With C per message the norm crosses p - 1 links up and the factor reaches rank 0 at once: the chain's step is at
  // least the blocking step, and the local rule's is below both.
  const double C = 0.25;
  const double chain = step_time("zb-h2", 4, 8, StepUpdateWait::norm_chain, C);
  const double blocking = step_time("zb-h2", 4, 8, StepUpdateWait::blocking, C);
  const double local = step_time("zb-h2", 4, 8, StepUpdateWait::local, C);
  EXPECT_GE(chain, blocking);
  EXPECT_LT(local, blocking);
  EXPECT_GE(blocking, 3 * (1 + C) + 24 - 1e-9);  // (p - 1)(F + C) + m (F + B + W)
}

TEST(SyncWindowSim, TheChainByHand) {
  // zb-h2, p = 2, m = 2, F = 1, B = 2 all in its weight half (I = 0, W = 2), C = 1. Rank 0: F0 F1 I0 W0 I1 W1,
  // rank 1: F0 I0 F1 I1 W0 W1. Rank 0: F0 0-1, F1 1-2; gradient 0 (sent at 3) arrives 4: I0, W0 4-6; gradient 1
  // (sent at 5, posted at 4) arrives 6: I1, W1 6-8, reaches U(0) at 8. Rank 1: activation 0 arrives 2: F0 2-3,
  // I0 at 3; activation 1 (posted at 3) arrives 4: F1 4-5, I1 at 5, W0 W1 5-9, reaches U(0) at 9. Chain: rank 1's
  // partial leaves at 9 and arrives at rank 0 at 10 (after its own 8), the factor reaches rank 1 at 11. Blocking:
  // both at 9. Local: rank 0 at 8, rank 1 at 9.
  const ScheduleSpec spec{"zb-h2", 2, 2, 1};
  const Schedule w = sync_window_schedule(spec, 2);
  CostModel c = unit(1.0);
  c.weight_share = 1.0;
  auto u0 = [&](StepUpdateWait wait) { return mt::plan::simulate_sync_window(spec, 2, w, c, wait).update_end[0]; };
  EXPECT_DOUBLE_EQ(u0(StepUpdateWait::norm_chain), 11.0);
  EXPECT_DOUBLE_EQ(u0(StepUpdateWait::blocking), 9.0);
  EXPECT_DOUBLE_EQ(u0(StepUpdateWait::local), 9.0);
}

// The back-to-back path is taken under the local rule: step 1's first forward on rank 0 starts before step 0's last
// W on rank p - 1 ends; under the norm rule it never does.
TEST(SyncWindowSim, StepTPlusOneStartsOnRankZeroBeforeStepTEndsOnTheLastRankOnlyWithLocalUpdates) {
  const ScheduleSpec spec{"zb-h2", 4, 8, 1};
  const Schedule w = sync_window_schedule(spec, 3);
  auto gap = [&](StepUpdateWait wait) {
    const mt::plan::SyncWindowSim s = mt::plan::simulate_sync_window(spec, 3, w, unit(), wait);
    double f8_start = -1, w7_end = -1;
    for (const mt::plan::Box& b : s.result.boxes[0])
      if (b.kind == ActionKind::forward && b.micro_batch == 8) f8_start = b.start;
    for (const mt::plan::Box& b : s.result.boxes[3])
      if (b.kind == ActionKind::backward_weight && b.micro_batch == 7) w7_end = b.end;
    EXPECT_GE(f8_start, 0);
    EXPECT_GE(w7_end, 0);
    return w7_end - f8_start;
  };
  EXPECT_GT(gap(StepUpdateWait::local), 0);
  EXPECT_LE(gap(StepUpdateWait::norm_chain), 0);
  EXPECT_LE(gap(StepUpdateWait::blocking), 0);
}

}  // namespace
