// `meshtrain simulate --schedule pipedream --steps K` (and pipemare): the window without a flush
// (parallel/pipeline/micro_window.h) replayed beside 1F1B's K flushed steps, with the figures worked out by hand
// (F = 1, B = 2, free messages and updates: a window of K steps of m micro-batches takes (K m + p - 1) 3 units,
// 1F1B's flushed steps K (m + p - 1) 3), and the window list's in-flight count and stash per rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_util.h"

namespace {

using mt::clitest::contains;
using mt::clitest::run_simulate;
using mt::clitest::RunResult;

TEST(MicroWindowCli, PipeDreamWindowAgainstFlushedOneFOneB) {
  // p = 4, m = 4, K = 12: (48 + 3) 3 = 153 against 12 (4 + 3) 3 = 252 (0.6071x); in flight p - j on rank j.
  RunResult r = run_simulate({"--schedule", "pipedream", "--stages", "4", "--micro-batches", "4", "--steps", "12"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "12 steps of 4 micro-batches without a flush")) << r.out;
  EXPECT_TRUE(contains(r.out, "an update after every micro-batch's backward")) << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 153\n")) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "1f1b, 12 flushed steps: makespan 252 (21 per step), bubble 42.9%; this window: 12.75 "
                       "per step (0.6071x 1f1b's)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "steady state: step 12 adds 12 to the makespan for 48 of work on 4 ranks: bubble 0.0%"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "in flight per rank: [4, 3, 2, 1]; weight versions per rank with stashing: [4, 3, 2, 1]"))
      << r.out;
  // The updates as collectives: each micro-batch costs F + p B = 9 in steady state (micro_window_test.cpp).
  EXPECT_TRUE(contains(r.out,
                       "with the updates as blocking collectives over all ranks (each micro-batch's norm): "
                       "makespan "))
      << r.out;
}

TEST(MicroWindowCli, PipeMareWindowActionsHoldAnUpdatePerMicroBatch) {
  // p = 2, m = 2, K = 2: rank 0's step 1 forward F2 before step 0's last backward B1 and its update.
  RunResult r =
      run_simulate({"--schedule", "pipemare", "--stages", "2", "--micro-batches", "2", "--steps", "2", "--actions"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "in flight per rank: [2, 1]")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 0: F0 F1 B0 F2 B1 F3 B2 B3")) << r.out;
  EXPECT_TRUE(contains(r.out, "optimizer_step(i=3, c=0)\n")) << r.out;
}

}  // namespace
