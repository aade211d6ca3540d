// Pipeline schedules (parallel/pipeline/schedule.h) against lists written out by hand from each schedule's
// definition and the send/receive rule in the header, plus validation and activation memory.
//
// Legend: p stages (ranks), m micro-batches, V chunks per rank, i micro-batch, j rank, c chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "actions.h"
#include "parallel/pipeline/schedule.h"

namespace mt::pipeline {
// gtest prints Actions by this when a comparison fails.
void PrintTo(const Action& a, std::ostream* os) { *os << to_string(a); }
}  // namespace mt::pipeline

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

std::string summary(const ScheduleSpec& spec, int j) {
  return compute_summary(make_schedule(spec)[j], spec.virtual_stages);
}

// ---- Whole lists. Each block is one computation: [wait for its input] [post for the next one's input]
// compute [send its output]. ----

TEST(Schedule, GpipeTwoStagesTwoMicroBatches) {
  const Schedule s = make_schedule({"gpipe", 2, 2, 1});
  ASSERT_EQ(s.size(), 2u);
  // Rank 0 = stage 0: forwards need no input and send to rank 1; backwards wait for rank 1's gradient.
  EXPECT_EQ(s[0], (std::vector<Action>{
                      F(0), SA(0, 0, 1),                // next is F1: no input to post
                      PG(0, 0, 1), F(1), SA(1, 0, 1),   // next is B0: post its gradient now
                      WG(0, 0, 1), PG(1, 0, 1), B(0),   // stage 0 sends no gradient
                      WG(1, 0, 1), B(1),                //
                      STEP()}));
  // Rank 1 = the last stage: forwards wait for rank 0's activations, backwards start from the local loss.
  EXPECT_EQ(s[1], (std::vector<Action>{
                      PA(0, 0, 0),                       // before the first computation
                      WA(0, 0, 0), PA(1, 0, 0), F(0),    // the last stage sends no activation
                      WA(1, 0, 0), F(1),                 // next is B0: nothing to post
                      B(0), SG(0, 0, 0),                 //
                      B(1), SG(1, 0, 0),                 //
                      STEP()}));
}

TEST(Schedule, OneFOneBTwoStagesThreeMicroBatches) {
  const Schedule s = make_schedule({"1f1b", 2, 3, 1});
  ASSERT_EQ(s.size(), 2u);
  // Rank 0: warm-up min(p - 0 - 1, m) = 1 forward, then F1 B0, F2 B1, then B2.
  EXPECT_EQ(s[0], (std::vector<Action>{
                      F(0), SA(0, 0, 1),               // next is F1: no input to post
                      PG(0, 0, 1), F(1), SA(1, 0, 1),  // next is B0: post its gradient now
                      WG(0, 0, 1), B(0),               // next is F2: nothing to post
                      PG(1, 0, 1), F(2), SA(2, 0, 1),  //
                      WG(1, 0, 1), PG(2, 0, 1), B(1),  //
                      WG(2, 0, 1), B(2),               //
                      STEP()}));
  // Rank 1 (last stage): no warm-up, F0 B0 F1 B1 F2 B2; the loss is local, so backwards wait for nothing.
  EXPECT_EQ(s[1], (std::vector<Action>{
                      PA(0, 0, 0),                            // before the first computation
                      WA(0, 0, 0), F(0),                      // next is B0: nothing to post
                      PA(1, 0, 0), B(0), SG(0, 0, 0),         //
                      WA(1, 0, 0), F(1),                      //
                      PA(2, 0, 0), B(1), SG(1, 0, 0),         //
                      WA(2, 0, 0), F(2),                      //
                      B(2), SG(2, 0, 0),                      //
                      STEP()}));
}

TEST(Schedule, InterleavedTwoStagesTwoMicroBatchesTwoChunks) {
  // Stages: rank 0 holds s0 (c0) and s2 (c1), rank 1 holds s1 (c0) and s3 (c1); s3 has the loss.
  const Schedule s = make_schedule({"interleaved", 2, 2, 2});
  ASSERT_EQ(s.size(), 2u);
  // Rank 0: warm-up (p - 1) * 2 + (V - 1) * p = 4 = m V: all forwards (c0 of i 0, 1, then c1), then all
  // backwards with chunks from last to first.
  EXPECT_EQ(s[0], (std::vector<Action>{
                      F(0, 0), SA(0, 0, 1),                            // s0 -> s1
                      PA(0, 1, 1), F(1, 0), SA(1, 0, 1),               // next: F(0, c1) needs s1's output
                      WA(0, 1, 1), PA(1, 1, 1), F(0, 1), SA(0, 1, 1),  // s2 -> s3
                      WA(1, 1, 1), PG(0, 1, 1), F(1, 1), SA(1, 1, 1),  //
                      WG(0, 1, 1), PG(1, 1, 1), B(0, 1), SG(0, 1, 1),  // s2's input gradient -> s1
                      WG(1, 1, 1), PG(0, 0, 1), B(1, 1), SG(1, 1, 1),  //
                      WG(0, 0, 1), PG(1, 0, 1), B(0, 0),               // s0: nothing to send
                      WG(1, 0, 1), B(1, 0),                            //
                      STEP()}));
  // Rank 1: warm-up (V - 1) * p = 2 forwards, then F(0,c1) B(0,c1) F(1,c1) B(1,c1), then B(0,c0) B(1,c0).
  EXPECT_EQ(s[1], (std::vector<Action>{
                      PA(0, 0, 0),                                     //
                      WA(0, 0, 0), PA(1, 0, 0), F(0, 0), SA(0, 0, 0),  // s1 -> s2 on rank 0
                      WA(1, 0, 0), PA(0, 1, 0), F(1, 0), SA(1, 0, 0),  //
                      WA(0, 1, 0), F(0, 1),                            // s3: the loss, next B(0, c1)
                      PA(1, 1, 0), B(0, 1), SG(0, 1, 0),               //
                      WA(1, 1, 0), F(1, 1),                            //
                      PG(0, 0, 0), B(1, 1), SG(1, 1, 0),               //
                      WG(0, 0, 0), PG(1, 0, 0), B(0, 0), SG(0, 0, 0),  //
                      WG(1, 0, 0), B(1, 0), SG(1, 0, 0),               //
                      STEP()}));
}

TEST(Schedule, SingleRankHasNoMessages) {
  // p = 1: every stage is local, activations are handed over in memory.
  EXPECT_EQ(make_schedule({"gpipe", 1, 2, 1})[0], (std::vector<Action>{F(0), F(1), B(0), B(1), STEP()}));
  EXPECT_EQ(make_schedule({"1f1b", 1, 2, 1})[0], (std::vector<Action>{F(0), B(0), F(1), B(1), STEP()}));
  // Interleaved with p = 1, V = 2: warm-up (V - 1) * p = 1, then F(0,c1) B(0,c1), ...
  EXPECT_EQ(make_schedule({"interleaved", 1, 2, 2})[0],
            (std::vector<Action>{F(0, 0), F(0, 1), B(0, 1), F(1, 0), B(0, 0), F(1, 1), B(1, 1), B(1, 0), STEP()}));
}

// ---- Compute orders of bigger cases, in the short form. ----

TEST(Schedule, ComputeOrdersFourStages) {
  // GPipe: the same on every rank.
  for (int j = 0; j < 4; j++) EXPECT_EQ(summary({"gpipe", 4, 4, 1}, j), "F0 F1 F2 F3 B0 B1 B2 B3");
  // 1F1B, m = 4: warm-up 3, 2, 1, 0.
  EXPECT_EQ(summary({"1f1b", 4, 4, 1}, 0), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(summary({"1f1b", 4, 4, 1}, 1), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(summary({"1f1b", 4, 4, 1}, 2), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(summary({"1f1b", 4, 4, 1}, 3), "F0 B0 F1 B1 F2 B2 F3 B3");
  // 1F1B with fewer micro-batches than the warm-up wants: capped at m.
  EXPECT_EQ(summary({"1f1b", 4, 2, 1}, 0), "F0 F1 B0 B1");
  EXPECT_EQ(summary({"1f1b", 4, 2, 1}, 2), "F0 F1 B0 B1");  // warm-up 1, then F1 B0, then B1
  EXPECT_EQ(summary({"1f1b", 4, 2, 1}, 3), "F0 B0 F1 B1");
  // Interleaved p = 4, m = 4, V = 2: warm-up 10 -> 8 (capped), 8, 6, 4.
  const std::string all_forward = "F0c0 F1c0 F2c0 F3c0 F0c1 F1c1 F2c1 F3c1 B0c1 B1c1 B2c1 B3c1 B0c0 B1c0 B2c0 B3c0";
  EXPECT_EQ(summary({"interleaved", 4, 4, 2}, 0), all_forward);
  EXPECT_EQ(summary({"interleaved", 4, 4, 2}, 1), all_forward);
  EXPECT_EQ(summary({"interleaved", 4, 4, 2}, 2),
            "F0c0 F1c0 F2c0 F3c0 F0c1 F1c1 F2c1 B0c1 F3c1 B1c1 B2c1 B3c1 B0c0 B1c0 B2c0 B3c0");
  EXPECT_EQ(summary({"interleaved", 4, 4, 2}, 3),
            "F0c0 F1c0 F2c0 F3c0 F0c1 B0c1 F1c1 B1c1 F2c1 B2c1 F3c1 B3c1 B0c0 B1c0 B2c0 B3c0");
}

TEST(Schedule, InterleavedWalksMicroBatchesInGroupsOfP) {
  // p = 2, m = 4, V = 2: forwards c0 of {0,1}, c1 of {0,1}, c0 of {2,3}, c1 of {2,3}; backwards the same
  // with c1 first. Warm-up 4 on rank 0, 2 on rank 1.
  EXPECT_EQ(summary({"interleaved", 2, 4, 2}, 0),
            "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0");
  EXPECT_EQ(summary({"interleaved", 2, 4, 2}, 1),
            "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0");
}

TEST(Schedule, BackwardsAscendInEveryChunk) {
  // Why: every schedule then sums each parameter's gradient over micro-batches 0, 1, ..., m - 1 in that
  // order, so all schedules give bit-identical gradients (see the header).
  for (const ScheduleSpec& spec : std::vector<ScheduleSpec>{{"gpipe", 3, 5, 1}, {"1f1b", 3, 5, 1},
                                                            {"interleaved", 3, 6, 2}, {"interleaved", 2, 4, 3}}) {
    const Schedule s = make_schedule(spec);
    for (int j = 0; j < spec.stages; j++) {
      for (int c = 0; c < spec.virtual_stages; c++) {
        std::vector<int> order;
        for (const Action& a : s[j])
          if (a.kind == ActionKind::backward && a.chunk == c) order.push_back(a.micro_batch);
        ASSERT_EQ((int)order.size(), spec.micro_batches);
        EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << spec.name << " rank " << j << " chunk " << c;
      }
    }
  }
}

// ---- Activation memory: forwards minus backwards along the list. ----

TEST(Schedule, OneFOneBHoldsAtMostPMinusJActivations) {
  for (int p = 1; p <= 4; p++) {
    for (int m = 1; m <= 9; m++) {
      const Schedule one = make_schedule({"1f1b", p, m, 1}), gp = make_schedule({"gpipe", p, m, 1});
      for (int j = 0; j < p; j++) {
        EXPECT_LE(peak_in_flight(one[j]), p - j) << "p=" << p << " m=" << m << " j=" << j;
        EXPECT_EQ(peak_in_flight(one[j]), std::min(p - j, m)) << "p=" << p << " m=" << m << " j=" << j;
        EXPECT_EQ(peak_in_flight(gp[j]), m) << "p=" << p << " m=" << m << " j=" << j;
      }
    }
  }
}

// ---- Validation ----

std::string error_of(const ScheduleSpec& spec) {
  try {
    make_schedule(spec);
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Schedule, RejectsBadSpecsNamingTheValues) {
  EXPECT_NE(error_of({"zigzag", 2, 2, 1}).find("unknown pipeline schedule 'zigzag'; choose one of gpipe, 1f1b, "
                                               "interleaved, zb-h1, zb-h2, zb-v"),
            std::string::npos);
  EXPECT_NE(error_of({"gpipe", 0, 2, 1}).find("p must be at least 1, got 0"), std::string::npos);
  EXPECT_NE(error_of({"1f1b", 2, 0, 1}).find("m must be at least 1, got 0"), std::string::npos);
  EXPECT_NE(error_of({"1f1b", 2, 2, 2}).find("1f1b runs one chunk per rank, got V = 2"), std::string::npos);
  EXPECT_NE(error_of({"gpipe", 2, 2, 0}).find("must be at least 1, got 0"), std::string::npos);
  EXPECT_NE(error_of({"interleaved", 2, 2, 1}).find("needs V >= 2"), std::string::npos);
  const std::string e = error_of({"interleaved", 4, 6, 2});
  EXPECT_NE(e.find("m = 6"), std::string::npos) << e;
  EXPECT_NE(e.find("p = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("try m = 4 or 8"), std::string::npos) << e;
  EXPECT_NE(error_of({"interleaved", 4, 3, 2}).find("try m = 4"), std::string::npos);
  EXPECT_NE(error_of({"gpipe", 1000, 2000, 1}).find("more than the 1000000"), std::string::npos);
  EXPECT_EQ(error_of({"interleaved", 4, 8, 3}), "(no error)");
}

TEST(Schedule, MessageNamesBothEnds) {
  // Rank 1, chunk 1 of p = 2 is stage 3; its input activation comes from stage 2 on rank 0.
  const Placement looped = Placement::looped(2, 2);
  EXPECT_EQ(message_of(WA(5, 1, 0), 1, looped), (Message{false, 5, 2, 3, 0, 1}));
  // Rank 0, chunk 1 is stage 2: its input gradient goes to stage 1 on rank 1.
  EXPECT_EQ(message_of(SG(5, 1, 1), 0, looped), (Message{true, 5, 2, 1, 0, 1}));
  // The sender's and receiver's views of one activation agree.
  EXPECT_EQ(message_of(SA(3, 0, 0), 1, looped), message_of(PA(3, 1, 1), 0, looped));
}

}  // namespace

// ---- Forward-only lists (evaluation): ascending (micro-batch, chunk), the message rule of step 2, no step. ----
TEST(ForwardOnly, TwoStagesTwoMicroBatches) {
  const Schedule s = forward_only(Placement::looped(2, 1), 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (std::vector<Action>{F(0), SA(0, 0, 1), F(1), SA(1, 0, 1)}));
  EXPECT_EQ(s[1], (std::vector<Action>{PA(0, 0, 0), WA(0, 0, 0), PA(1, 0, 0), F(0), WA(1, 0, 0), F(1)}));
}

TEST(ForwardOnly, InterleavedChunksHopBetweenRanks) {
  // p = 2, V = 2: stages 0, 1, 2, 3 on ranks 0, 1, 0, 1. Any m (no m % p rule without backwards).
  const Schedule s = forward_only(Placement::looped(2, 2), 1);
  EXPECT_EQ(s[0], (std::vector<Action>{PA(0, 1, 1), F(0, 0), SA(0, 0, 1), WA(0, 1, 1), F(0, 1), SA(0, 1, 1)}));
  EXPECT_EQ(s[1], (std::vector<Action>{PA(0, 0, 0), WA(0, 0, 0), PA(0, 1, 0), F(0, 0), SA(0, 0, 0), WA(0, 1, 0),
                                       F(0, 1)}));
  EXPECT_THROW(forward_only(Placement::looped(2, 1), 0), mt::InputError);
}
