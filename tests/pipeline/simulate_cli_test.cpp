// `meshtrain simulate` end to end: the figures of DESIGN.md on stdout, the action lists, the SVG written
// atomically, and bad specs rejected with their values named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli/cli_test_util.h"

namespace {

using mt::clitest::contains;
using mt::clitest::run_simulate;
using mt::clitest::RunResult;
using mt::clitest::TempDir;

TEST(SimulateCli, GpipeFiguresFromTheDesign) {
  RunResult r1 =
      run_simulate({"--schedule", "gpipe", "--stages", "4", "--micro-batches", "1", "--backward-ratio", "2"});
  ASSERT_EQ(r1.exit_code, 0) << r1.describe();
  EXPECT_TRUE(contains(r1.out, "utilization 25.0% (busy 12 of 48)")) << r1.out;
  EXPECT_TRUE(contains(r1.out, "bubble fraction 75.0% (ideal (p-1)/(m+p-1) = 3/4 = 75.0%)")) << r1.out;

  RunResult r4 = run_simulate({"--schedule", "gpipe", "--stages", "4", "--micro-batches", "4"});
  ASSERT_EQ(r4.exit_code, 0) << r4.describe();
  EXPECT_TRUE(contains(r4.out, "schedule gpipe: p = 4 stages, m = 4 micro-batches, V = 1 chunk per rank")) << r4.out;
  EXPECT_TRUE(contains(r4.out, "utilization 57.1% (busy 48 of 84)")) << r4.out;
  EXPECT_TRUE(contains(r4.out, "bubble fraction 42.9% (ideal (p-1)/(m+p-1) = 3/7 = 42.9%)")) << r4.out;
  EXPECT_TRUE(contains(r4.out, "rank 0: busy 12, idle 9, peak in-flight activations 4")) << r4.out;

  RunResult r8 = run_simulate({"--schedule", "gpipe", "--stages", "4", "--micro-batches", "8"});
  ASSERT_EQ(r8.exit_code, 0) << r8.describe();
  EXPECT_TRUE(contains(r8.out, "utilization 72.7% (busy 96 of 132)")) << r8.out;
}

TEST(SimulateCli, ZeroBubbleBoundNotOneFOneBsFormula) {
  RunResult h2 = run_simulate({"--schedule", "zb-h2", "--stages", "4", "--micro-batches", "8"});
  ASSERT_EQ(h2.exit_code, 0) << h2.err;
  EXPECT_TRUE(contains(h2.out, "bubble fraction 11.1% (zero-bubble bound at F = B = W, ranks starting the step "
                               "together: (p-1)/(3m+p-1) = 3/27 = 11.1%)"))
      << h2.out;
  RunResult v = run_simulate({"--schedule", "zb-v", "--stages", "4", "--micro-batches", "8", "--virtual-stages", "2"});
  ASSERT_EQ(v.exit_code, 0) << v.err;
  EXPECT_TRUE(contains(v.out, "bubble fraction 5.9% (zero-bubble bound at F = B = W, ranks starting the step "
                              "together: (p-1)/(6m+p-1) = 3/51 = 5.9%)"))
      << v.out;
}

TEST(SimulateCli, SendAndPostCostsArePrintedAndCharged) {
  // 1F1B p = 2, m = 1 with messages 0.5, sends 0.25 and posts 0.125 (Simulator.SendsAndPostsOccupyTheirRank by
  // hand): makespan 6 + 0.125 + 2 x 0.25 + 2 x 0.5 = 7.625.
  RunResult r = run_simulate({"--schedule", "1f1b", "--stages", "2", "--micro-batches", "1", "--comm-cost", "0.5",
                              "--send-cost", "0.25", "--post-cost", "0.125"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "cost of a message on its ranks: send 0.25, post 0.125 (computing nothing: bubble)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 7.625")) << r.out;
  RunResult bad = run_simulate({"--schedule", "1f1b", "--stages", "2", "--micro-batches", "1", "--send-cost", "-1"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.err, "send cost")) << bad.describe();
}

TEST(SimulateCli, OneFOneBActionsAndInterleaved) {
  RunResult r = run_simulate({"--schedule", "1f1b", "--stages", "2", "--micro-batches", "3", "--actions"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "rank 0: F0 F1 B0 F2 B1 B2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1: F0 B0 F1 B1 F2 B2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "     1  send_act(i=0, c=0, to=1)\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "    15  optimizer_step\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "bubble fraction 25.0% (ideal (p-1)/(m+p-1) = 1/4 = 25.0%)")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1: busy 9, idle 3, peak in-flight activations 1")) << r.out;

  RunResult ri =
      run_simulate({"--schedule", "interleaved", "--stages", "4", "--micro-batches", "8", "--virtual-stages", "2"});
  ASSERT_EQ(ri.exit_code, 0) << ri.describe();
  EXPECT_TRUE(contains(ri.out, "bubble fraction 15.8% (ideal (p-1)/(V*m+p-1) = 3/19 = 15.8%)")) << ri.out;
  EXPECT_TRUE(contains(ri.out, "cost: forward 1 per rank (0.5 per chunk), backward 2 x forward, message 0"))
      << ri.out;
}

TEST(SimulateCli, WritesTheSvgAtomically) {
  TempDir dir;
  const std::string svg = dir / "pipe.svg";
  RunResult r = run_simulate(
      {"--schedule", "1f1b", "--stages", "4", "--micro-batches", "8", "--comm-cost", "0.25", "--svg", svg});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "wrote " + svg)) << r.err;
  const std::string doc = mt::clitest::slurp(svg);
  EXPECT_EQ(doc.rfind("<?xml", 0), 0u);
  EXPECT_TRUE(contains(doc, "1f1b schedule: p = 4 stages, m = 8 micro-batches"));
  EXPECT_TRUE(contains(doc, "message cost 0.25"));
  EXPECT_EQ(doc.substr(doc.size() - 7), "</svg>\n");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST(SimulateCli, BadSpecsAreRejectedWithTheirValues) {
  RunResult r =
      run_simulate({"--schedule", "interleaved", "--stages", "4", "--micro-batches", "6", "--virtual-stages", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_TRUE(contains(r.err, "meshtrain: error: pipeline schedule interleaved needs the number of micro-batches m = 6 "
                              "to be a multiple of the number of stages p = 4"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "try m = 4 or 8")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  RunResult u = run_simulate({"--schedule", "no-such-schedule", "--stages", "2", "--micro-batches", "2"});
  EXPECT_EQ(u.exit_code, 1) << u.describe();
  EXPECT_TRUE(contains(u.err, "unknown pipeline schedule 'no-such-schedule'; choose one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v"))
      << u.err;

  RunResult v = run_simulate({"--schedule", "interleaved", "--stages", "2", "--micro-batches", "2"});
  EXPECT_EQ(v.exit_code, 1) << v.describe();
  EXPECT_TRUE(contains(v.err, "needs V >= 2 virtual stages (chunks) per rank, got V = 1")) << v.err;

  RunResult c = run_simulate({"--schedule", "gpipe", "--stages", "2", "--micro-batches", "2", "--comm-cost", "-1"});
  EXPECT_EQ(c.exit_code, 1) << c.describe();
  EXPECT_TRUE(contains(c.err, "message cost must be >= 0, got -1")) << c.err;

  RunResult missing = run_simulate({"--schedule", "gpipe", "--stages", "2"});
  EXPECT_NE(missing.exit_code, 0) << missing.describe();
  EXPECT_TRUE(contains(missing.err, "--micro-batches")) << missing.err;
}

TEST(SimulateCli, ReplaysARunFromItsSummary) {
  // gpipe, p = 2, m = 4, rank 1 twice as slow as rank 0 (stage forward 1 and 2 ms, backward 2 and 4 ms): rank 1's
  // forwards run 1..9, its backwards 9..25, rank 0's last backward 25..27 (makespan 27, busy 12 + 24 = 36).
  TempDir dir;
  const std::string path = dir.path() + "/summary.json";
  {
    std::ofstream f(path);
    f << R"({"pipeline": {"schedule": "gpipe", "stages": 2, "micro_batches": 4, "virtual_stages": 1,
             "stage_forward_ms": [1, 2], "stage_backward_ms": [2, 4], "message_latency_ms": 0,
             "bubble_measured": 0.4}})";
  }
  RunResult r = run_simulate({"--from-summary", path});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "schedule gpipe: p = 2 stages, m = 4 micro-batches")) << r.out;
  EXPECT_TRUE(contains(r.out, "stage 1 (rank 1, chunk 0): forward 2, backward 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 27\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "utilization 66.7% (busy 36 of 54)")) << r.out;
  EXPECT_TRUE(contains(r.out, "measured bubble of the run: 40.0% (+6.7 percentage points from the simulation)"))
      << r.out;

  const std::string bad = dir.path() + "/bad.json";
  {
    std::ofstream f(bad);
    f << R"({"tokens_per_s": 5})";
  }
  RunResult b = run_simulate({"--from-summary", bad});
  EXPECT_EQ(b.exit_code, 1) << b.describe();
  EXPECT_TRUE(contains(b.err, "has no \"pipeline\" section")) << b.err;
}

TEST(SimulateCli, ReplaysTheMeasuredWeightHalvesOfASplitSchedule) {
  // zb-h1, p = 2, m = 1, stage backward 3 and 5 ms of which the weight halves took 1 and 4 (the timeline of
  // MeasuredHalves.StagesWithTheirOwnHalvesByHand): makespan 8; without stage_weight_ms the halves are assumed
  // equal and the makespan is 8.5. A stage_weight_ms of the wrong length is refused, naming the key.
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& weight) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream f(path);
    f << R"({"pipeline": {"schedule": "zb-h1", "stages": 2, "micro_batches": 1, "virtual_stages": 1,
             "stage_forward_ms": [1, 2], "stage_backward_ms": [3, 5], "message_latency_ms": 0,
             "bubble_measured": 0.45)" << weight << "}}";
    return path;
  };
  RunResult r = run_simulate({"--from-summary", write("w.json", R"(, "stage_weight_ms": [1, 4])")});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "stage 1 (rank 1, chunk 0): forward 2, backward 5 (input half 1, weight half 4, "
                              "measured)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 8\n")) << r.out;
  RunResult old = run_simulate({"--from-summary", write("old.json", "")});
  ASSERT_EQ(old.exit_code, 0) << old.describe();
  EXPECT_TRUE(contains(old.out, "makespan 8.5\n")) << old.out;
  EXPECT_TRUE(contains(old.out, "(assumed, not measured)")) << old.out;
  RunResult bad = run_simulate({"--from-summary", write("bad.json", R"(, "stage_weight_ms": [1])")});
  EXPECT_EQ(bad.exit_code, 1) << bad.describe();
  EXPECT_TRUE(contains(bad.err, "pipeline.stage_weight_ms must have stages x virtual_stages = 2 entries, got 1"))
      << bad.err;
}

}  // namespace

// Chimera: the paper's closed form with F = B at p = m = 4, the cost line (a chunk is a whole stage), and the
// swimlane of both pipelines (each rank's two stages named, the closed form in the subtitle).
namespace {

TEST(SimulateCli, ChimeraClosedFormAndSwimlane) {
  TempDir dir;
  const std::string svg = dir / "chimera.svg";
  RunResult r = run_simulate({"--schedule", "chimera", "--stages", "4", "--micro-batches", "4", "--virtual-stages", "2",
                              "--backward-ratio", "1", "--svg", svg});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "cost: forward 1 per stage (one chunk), backward 1 x forward, message 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 10\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "bubble fraction 20.0% (Chimera's (p-2)/(2m+p-2) = 2/10 = 20.0%, with F = B and m a "
                              "multiple of p)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "rank 3: busy 8, idle 2")) << r.out;
  const std::string doc = mt::clitest::slurp(svg);
  EXPECT_TRUE(contains(doc, "rank 3 (stages 3,0)")) << doc.substr(0, 2000);
  EXPECT_TRUE(contains(doc, "bubble 20.0% (Chimera&apos;s (p-2)/(2m+p-2), F = B = 20.0%)")) << doc.substr(0, 2000);

  RunResult one =
      run_simulate({"--schedule", "1f1b", "--stages", "4", "--micro-batches", "4", "--backward-ratio", "1"});
  ASSERT_EQ(one.exit_code, 0) << one.describe();
  EXPECT_TRUE(contains(one.out, "bubble fraction 42.9%")) << one.out;
}

// Chimera p = 2, m = 2 with rank 0 twice as slow as rank 1 (RankChunkCosts' timeline): replayed per (rank,
// chunk) the makespan is 12 (bubble 25.0%); from the per-stage means alone (an older summary) 9 (bubble 0.0%).
// Per-(rank, chunk) lists of the wrong length are refused, naming the keys.
TEST(SimulateCli, ReplaysEachRanksOwnChunkTimes) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream f(path);
    f << R"({"pipeline": {"schedule": "chimera", "stages": 2, "micro_batches": 2, "virtual_stages": 2,
             "stage_forward_ms": [1.5, 1.5], "stage_backward_ms": [3, 3], "message_latency_ms": 0,
             "bubble_measured": 0.25)" << extra << "}}";
    return path;
  };
  RunResult r = run_simulate({"--from-summary", write("r.json", R"(, "rank_chunk_forward_ms": [2, 2, 1, 1],
             "rank_chunk_backward_ms": [4, 4, 2, 2], "rank_chunk_weight_ms": [])")});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.out, "rank 1 chunk 1 (stage 0): forward 1, backward 2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "makespan 12\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "measured bubble of the run: 25.0% (+0.0 percentage points from the simulation)"))
      << r.out;
  RunResult old = run_simulate({"--from-summary", write("old.json", "")});
  ASSERT_EQ(old.exit_code, 0) << old.describe();
  EXPECT_TRUE(contains(old.out, "makespan 9\n")) << old.out;
  RunResult bad = run_simulate({"--from-summary", write("bad.json", R"(, "rank_chunk_forward_ms": [2, 2, 1],
             "rank_chunk_backward_ms": [4, 4, 2, 2])")});
  EXPECT_EQ(bad.exit_code, 1) << bad.describe();
  EXPECT_TRUE(contains(bad.err, "pipeline.rank_chunk_forward_ms, rank_chunk_backward_ms and rank_chunk_weight_ms "
                                "must have stages x virtual_stages = 4 entries"))
      << bad.err;
}

}  // namespace
