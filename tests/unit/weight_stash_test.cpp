// The weight stash of per-micro-batch updates (train/weight_stash.h) on a plain buffer, driven through the
// calls the pipeline executor and the parameter store make for one rank's 1F1B list: which version the buffer
// holds at each forward and backward (pipedream: the forward's; pipemare: the newest; vertical sync: the
// version given for the micro-batch), that every update lands on the newest version, and the most versions
// in flight. An "update" adds 10 to every element, so the buffer's value names its version (value = 10 n + k).
#include "train/weight_stash.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"

namespace {

using mt::train::WeightStash;
using M = WeightStash::MicroUpdates;

// Runs the compute order (F / B of micro-batch i, an update after each B) for `steps` steps on a 3-float
// buffer; returns the version each computation read, as "F0:0 F1:0 B0:0 ..." per step.
std::string drive(WeightStash& st, const std::vector<std::pair<char, int>>& order, int steps = 1) {
  std::vector<float> a{0.0f, 1.0f, 2.0f};
  st.bind(a.data(), a.size());
  std::string out;
  for (int s = 0; s < steps; s++) {
    st.before_forward();
    for (auto [kind, i] : order) {
      if (kind == 'F') st.before_micro_forward(i);
      else st.before_micro_backward(i);
      // Every element names the same version: the buffer is one consistent copy.
      EXPECT_EQ(a[1] - a[0], 1.0f);
      EXPECT_EQ(a[2] - a[0], 2.0f);
      out += std::string(out.empty() ? "" : " ") + kind + std::to_string(i) + ":" + std::to_string((int)a[0] / 10);
      if (kind == 'B') {
        st.before_update();
        for (float& x : a) x += 10.0f;
        st.after_update();
      }
    }
    out += " |";
  }
  return out;
}

// Stage 0 of p = 2, m = 3 under 1F1B: F0 F1 B0 F2 B1 B2.
const std::vector<std::pair<char, int>> kStage0{{'F', 0}, {'F', 1}, {'B', 0}, {'F', 2}, {'B', 1}, {'B', 2}};
// The last stage: F0 B0 F1 B1 F2 B2.
const std::vector<std::pair<char, int>> kLast{{'F', 0}, {'B', 0}, {'F', 1}, {'B', 1}, {'F', 2}, {'B', 2}};

TEST(WeightStash, PipeDreamBackwardReadsItsForwardsVersion) {
  WeightStash st(M::stashed, 3, {});
  // Versions count over the run: 3 updates per step (the second step starts at version 3).
  EXPECT_EQ(drive(st, kStage0, 2), "F0:0 F1:0 B0:0 F2:1 B1:0 B2:1 | F0:3 F1:3 B0:3 F2:4 B1:3 B2:4 |");
  EXPECT_EQ(st.peak(), 2);  // p - j = 2 on stage 0 of 2 (m >= 2 (p - 1) + 1)
  EXPECT_EQ(st.forward_version(2), 1);
  EXPECT_EQ(st.backward_version(1), 0);
  EXPECT_EQ(st.other(), nullptr);  // between steps one version: nothing else for a checkpoint
}

TEST(WeightStash, PipeMareBackwardReadsTheNewest) {
  WeightStash st(M::newest, 3, {});
  EXPECT_EQ(drive(st, kStage0), "F0:0 F1:0 B0:0 F2:1 B1:1 B2:2 |");
  EXPECT_EQ(st.peak(), 1);
  EXPECT_EQ(st.bytes(), 0u);  // nothing saved
}

TEST(WeightStash, LastStageHoldsOneVersion) {
  WeightStash st(M::stashed, 3, {});
  EXPECT_EQ(drive(st, kLast), "F0:0 B0:0 F1:1 B1:1 F2:2 B2:2 |");
  EXPECT_EQ(st.peak(), 1);
}

TEST(WeightStash, VerticalSyncReadsStageZerosVersion) {
  // Stage 0's reads (kStage0 under pipedream: F0:0 F1:0 F2:1), applied on the last stage, whose own newest
  // at F1 and F2 is 1 and 2.
  WeightStash st(M::stashed, 3, {0, 0, 1});
  EXPECT_EQ(drive(st, kLast), "F0:0 B0:0 F1:0 B1:0 F2:1 B2:1 |");
  EXPECT_EQ(st.peak(), 2);
}

TEST(WeightStash, VerticalSyncVersionsFromStageZerosList) {
  const mt::pipeline::Schedule s = mt::pipeline::make_schedule({"pipedream", 2, 3, 1});
  EXPECT_EQ(mt::train::vertical_sync_versions(s, 3), (std::vector<int>{0, 0, 1}));
  const mt::pipeline::Schedule s4 = mt::pipeline::make_schedule({"pipedream", 4, 8, 1});
  EXPECT_EQ(mt::train::vertical_sync_versions(s4, 8), (std::vector<int>{0, 0, 0, 0, 1, 2, 3, 4}));
}

TEST(WeightStash, OutOfOrderCallsAreBugs) {
  WeightStash st(M::stashed, 2, {});
  std::vector<float> a{0.0f};
  st.bind(a.data(), 1);
  st.before_forward();
  EXPECT_DEATH(st.before_micro_backward(0), "backward of micro-batch 0 before its forward");
}

}  // namespace

namespace {

// Without a flush (MicroVersions::begin_window): stage 0 of p = 2, m = 2, a window of 2 steps is one 1F1B list
// over 4 micro-batches, F0 F1 B0 F2 B1 F3 B2 B3; the loop's per-step before_forward (here between B1 and F3, where
// step 1's call runs) must not reset anything: B1 (step 0) still reads version 0, its forward's, after step 1's F2
// read version 1.
TEST(WeightStash, WindowKeepsVersionsAcrossTheStepBoundary) {
  WeightStash st(M::stashed, 2, {});
  std::vector<float> a{0.0f, 1.0f, 2.0f};
  st.bind(a.data(), a.size());
  st.before_forward();  // the loop's call for step 0, before the window opens
  st.begin_window(mt::pipeline::Schedule{}, 4);
  std::string out;
  const std::vector<std::pair<char, int>> order{{'F', 0}, {'F', 1}, {'B', 0}, {'F', 2}, {'B', 1},
                                                {'S', -1}, {'F', 3}, {'B', 2}, {'B', 3}};
  for (auto [kind, i] : order) {
    if (kind == 'S') {
      st.before_forward();  // step 1 begins in the loop
      continue;
    }
    if (kind == 'F') st.before_micro_forward(i);
    else st.before_micro_backward(i);
    out += std::string(out.empty() ? "" : " ") + kind + std::to_string(i) + ":" + std::to_string((int)a[0] / 10);
    if (kind == 'B') {
      st.before_update();
      for (float& x : a) x += 10.0f;
      st.after_update();
    }
  }
  EXPECT_EQ(out, "F0:0 F1:0 B0:0 F2:1 B1:0 F3:2 B2:1 B3:2");
  EXPECT_EQ(st.peak(), 2);  // p - j on stage 0 of 2
  EXPECT_EQ(a[0], 40.0f);   // the window ends with the newest version resident: 4 updates
}

}  // namespace
