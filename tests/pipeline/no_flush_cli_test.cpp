// `meshtrain simulate --schedule pipedream-2bw --steps K`: the window without a flush (parallel/pipeline/no_flush.h)
// replayed beside 1F1B's K flushed steps, with the figures worked out by hand (F = 1, B = 2, free messages: a
// window of K steps of m micro-batches takes (K m + p - 1) 3 units, 1F1B's flushed steps K (m + p - 1) 3); the
// window's lists with their step updates; --steps with a schedule that flushes refused, both flags named; the
// synchronous one-chunk schedules' back-to-back replay (sync_window.h) at p = 4, m = 8 against closed forms.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_util.h"

namespace {

using mt::clitest::contains;
using mt::clitest::run_simulate;
using mt::clitest::RunResult;

TEST(NoFlushCli, TwoBwWindowAgainstFlushedOneFOneB) {
  // p = 2, m = 4, K = 8: 99 against 120 (0.825x), bubble 1/33 against 1/5; one more step adds 12 = 3 m.
  RunResult r2 = run_simulate({"--schedule", "pipedream-2bw", "--stages", "2", "--micro-batches", "4", "--steps", "8"});
  ASSERT_EQ(r2.exit_code, 0) << r2.describe();
  EXPECT_TRUE(contains(r2.out, "schedule pipedream-2bw: p = 2 stages, m = 4 micro-batches")) << r2.out;
  EXPECT_TRUE(contains(r2.out, "8 steps of 4 micro-batches without a flush")) << r2.out;
  EXPECT_TRUE(contains(r2.out, "bubble fraction 3.0% (ideal (p-1)/(m+p-1) = 1/33 = 3.0%)")) << r2.out;
  EXPECT_TRUE(contains(r2.out, "1f1b, 8 flushed steps: makespan 120 (15 per step), bubble 20.0%; this window: 12.38 "
                               "per step (0.825x 1f1b's)"))
      << r2.out;
  EXPECT_TRUE(contains(r2.out, "steady state: step 8 adds 12 to the makespan for 24 of work on 2 ranks: bubble 0.0%"))
      << r2.out;
  // p = 4, m = 8, K = 8: 201 against 264; 1F1B's bubble 9/33.
  RunResult r4 = run_simulate({"--schedule", "pipedream-2bw", "--stages", "4", "--micro-batches", "8", "--steps", "8"});
  ASSERT_EQ(r4.exit_code, 0) << r4.describe();
  EXPECT_TRUE(contains(r4.out, "makespan 201\n")) << r4.out;
  EXPECT_TRUE(contains(r4.out, "bubble 27.3%; this window: 25.12 per step (0.7614x 1f1b's)")) << r4.out;
  EXPECT_TRUE(contains(r4.out, "steady state: step 8 adds 24 to the makespan for 96 of work on 4 ranks: bubble 0.0%"))
      << r4.out;
}

TEST(NoFlushCli, WindowActionsHoldTheStepUpdates) {
  RunResult r = run_simulate(
      {"--schedule", "pipedream-2bw", "--stages", "2", "--micro-batches", "2", "--steps", "3", "--actions"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "rank 0: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "optimizer_step(i=1, c=-1)\n")) << r.out;  // U(0): step 0 ends with micro-batch 1
  EXPECT_TRUE(contains(r.out, "optimizer_step(i=5, c=-1)\n")) << r.out;  // U(2), the drain
}

TEST(NoFlushCli, StepsRefusedForSchedulesThatFlush) {
  RunResult r = run_simulate({"--schedule", "gpipe", "--stages", "2", "--micro-batches", "4", "--steps", "3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--steps 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "--schedule gpipe flushes after every step")) << r.err;
}

TEST(SyncWindowCli, ZbH2BackToBackPerRule) {
  // F = 1, B = 2 (halves 1, 1), free messages: 1F1B's flushed step 3 (m + p - 1) = 33; zb-h2 with local updates
  // m (F + B) = 24 (0.7273x), under the norm, a blocking collective or the tied embedding (p - 1) F + m (F + B) = 27
  // (0.8182x).
  RunResult r = run_simulate({"--schedule", "zb-h2", "--stages", "4", "--micro-batches", "8", "--steps", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "against 1f1b's flushed step 33:")) << r.out;
  EXPECT_TRUE(contains(r.out, "no clipping, no tied copies) ")) << r.out;
  EXPECT_TRUE(contains(r.out, " 24 (0.7273x)\n")) << r.out;
  int n = 0;
  for (size_t at = r.out.find(" 27 (0.8182x)\n"); at != std::string::npos; at = r.out.find(" 27 (0.8182x)\n", at + 1)) n++;
  EXPECT_EQ(n, 3) << r.out;  // norm chain, blocking, tied embedding
  EXPECT_TRUE(contains(r.out, "(p-1)(F+C) + m(F+B) = 27 (0.8182x)")) << r.out;
  EXPECT_TRUE(contains(r.out, "in the last stage's I (as trained)")) << r.out;
}

}  // namespace
