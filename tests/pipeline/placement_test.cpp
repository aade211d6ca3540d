// Stage placement as data (parallel/pipeline/placement.h): the looped placement as a table, and two
// placements no generator builds yet, a V-shaped and a bidirectional one, built as routes, turned into action
// lists by the one message rule (with_communication) and judged by the checker, against lists written out
// by hand. Also the split backward (backward_input / backward_weight) in the checker.
//
// Legend: p ranks, m micro-batches, V chunks per rank, S stages, i micro-batch, j rank, c chunk, s stage.
#include "parallel/pipeline/placement.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "actions.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"

namespace mt::pipeline {
void PrintTo(const Action& a, std::ostream* os);  // schedule_test.cpp
}  // namespace mt::pipeline

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

using List = std::vector<Action>;

std::string placement_error(int p, int V, std::vector<std::vector<Slot>> routes) {
  try {
    Placement(p, V, std::move(routes));
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// p = 2, V = 2: down rank 0, 1, back up rank 1, 0. Stages 1 and 2 meet on rank 1, handed over in memory.
Placement v_shape() { return Placement(2, 2, {{{0, 0}, {1, 0}, {1, 1}, {0, 1}}}); }
// p = 2, S = 2, every stage held twice: even micro-batches go down (route 0), odd ones up (route 1).
Placement bidirectional() { return Placement(2, 2, {{{0, 0}, {1, 0}}, {{1, 1}, {0, 1}}}); }

TEST(Placement, LoopedIsChunkTimesPPlusRank) {
  const Placement pl = Placement::looped(3, 2);
  EXPECT_EQ(pl.stages(), 6);
  EXPECT_EQ(pl.routes(), 1);
  EXPECT_EQ(pl.stage_of(0, 0), 0);
  EXPECT_EQ(pl.stage_of(2, 0), 2);
  EXPECT_EQ(pl.stage_of(0, 1), 3);
  EXPECT_EQ(pl.stage_of(1, 1), 4);
  EXPECT_EQ(pl.slot(7, 5), (Slot{2, 1}));
  EXPECT_TRUE(pl.visits(7, 1, 1));
  EXPECT_EQ(pl.describe(), "rank 0: stages 0,3; rank 1: stages 1,4; rank 2: stages 2,5");
  EXPECT_EQ(placement_of({"interleaved", 3, 3, 2}), pl);  // what the interleaved generator chooses
  EXPECT_EQ(placement_of({"1f1b", 3, 5, 1}), Placement::looped(3, 1));
}

TEST(Placement, RoutesMustCoverEverySlotOnce) {
  EXPECT_NE(placement_error(2, 1, {{{0, 0}, {0, 0}}}).find("rank 0 chunk 0 holds two stages (0 on route 0 and 1"),
            std::string::npos);
  EXPECT_NE(placement_error(2, 2, {{{0, 0}, {1, 0}}}).find("rank 0 chunk 1 holds no stage"), std::string::npos);
  EXPECT_NE(placement_error(2, 1, {{{0, 0}, {2, 0}}}).find("stage 1 on rank 2 chunk 0, outside 2 ranks x 1 chunks"),
            std::string::npos);
  EXPECT_NE(placement_error(2, 2, {{{0, 0}, {1, 0}}, {{1, 1}}}).find("route 1 has 1 stages, route 0 has 2"),
            std::string::npos);
}

TEST(Placement, VShapedListsHandOverAtTheTurn) {
  const Placement pl = v_shape();
  EXPECT_EQ(pl.describe(), "rank 0: stages 0,3; rank 1: stages 1,2");
  const ScheduleSpec spec{"v-shape", 2, 1, 2};
  const Schedule s =
      with_communication(pl, {{F(0, 0), F(0, 1), B(0, 1), B(0, 0)}, {F(0, 0), F(0, 1), B(0, 1), B(0, 0)}});
  // Rank 0 holds stages 0 and 3: both ends of the V. Rank 1 holds 1 and 2: the turn, no message between them.
  EXPECT_EQ(s[0], (List{PA(0, 1, 1), F(0, 0), SA(0, 0, 1), WA(0, 1, 1), F(0, 1), PG(0, 0, 1), B(0, 1), SG(0, 1, 1),
                        WG(0, 0, 1), B(0, 0), STEP()}));
  EXPECT_EQ(s[1], (List{PA(0, 0, 0), WA(0, 0, 0), F(0, 0), PG(0, 1, 0), F(0, 1), SA(0, 1, 0), WG(0, 1, 0), B(0, 1),
                        B(0, 0), SG(0, 0, 0), STEP()}));
  EXPECT_EQ(check_error(spec, s), "(passed)");
  EXPECT_EQ(message_of(SA(0, 1, 0), 1, pl), (Message{false, 0, 2, 3, 1, 0}));
  // The turn is in memory: stage 2's forward must follow stage 1's on rank 1, and a message there is refused.
  EXPECT_NE(check_error(spec, with_communication(
                                  pl, {{F(0, 0), F(0, 1), B(0, 1), B(0, 0)}, {F(0, 1), F(0, 0), B(0, 1), B(0, 0)}}))
                .find("forward of stage 2 before the forward of stage 1 on this rank"),
            std::string::npos);
  Schedule sent = s;
  sent[1].insert(sent[1].begin() + 3, SA(0, 0, 1));
  EXPECT_NE(check_error(spec, sent).find("stage 2 is on this rank too"), std::string::npos);
  // A V-shaped 1F1B-like order over m = 4 is consistent and deadlock-free too.
  const ScheduleSpec spec4{"v-shape", 2, 4, 2};
  List r0, r1;
  for (int i = 0; i < 4; i++) {
    for (List* r : {&r0, &r1}) r->insert(r->end(), {F(i, 0), F(i, 1), B(i, 1), B(i, 0)});
  }
  EXPECT_EQ(check_error(spec4, with_communication(pl, {r0, r1})), "(passed)");
}

TEST(Placement, BidirectionalListsRunBothDirections) {
  const Placement pl = bidirectional();
  EXPECT_EQ(pl.stages(), 2);
  EXPECT_EQ(pl.routes(), 2);
  EXPECT_EQ(pl.slot(1, 0), (Slot{1, 1}));  // micro-batch 1 starts on rank 1
  EXPECT_FALSE(pl.visits(1, 0, 0));
  const ScheduleSpec spec{"bidirectional", 2, 2, 2};
  // Rank 0 runs micro-batch 0's first stage and micro-batch 1's last; rank 1 the other way round.
  const Schedule s =
      with_communication(pl, {{F(0, 0), F(1, 1), B(1, 1), B(0, 0)}, {F(1, 1), F(0, 0), B(0, 0), B(1, 1)}});
  EXPECT_EQ(s[0], (List{PA(1, 1, 1), F(0, 0), SA(0, 0, 1), WA(1, 1, 1), F(1, 1), PG(0, 0, 1), B(1, 1), SG(1, 1, 1),
                        WG(0, 0, 1), B(0, 0), STEP()}));
  EXPECT_EQ(s[1], (List{PA(0, 0, 0), F(1, 1), SA(1, 1, 0), WA(0, 0, 0), F(0, 0), PG(1, 1, 0), B(0, 0), SG(0, 0, 0),
                        WG(1, 1, 0), B(1, 1), STEP()}));
  EXPECT_EQ(check_error(spec, s), "(passed)");
  // Micro-batch 1 never passes through rank 0's chunk 0 (stage 0 of the down route).
  Schedule wrong = s;
  wrong[0].insert(wrong[0].begin() + 1, F(1, 0));
  EXPECT_NE(check_error(spec, wrong).find("micro-batch 1 does not pass through chunk 0 of rank 0 (route 1"),
            std::string::npos);
  // Evaluation lists follow each micro-batch's own route.
  const Schedule fo = forward_only(pl, 2);
  EXPECT_EQ(fo[0], (List{PA(1, 1, 1), F(0, 0), SA(0, 0, 1), WA(1, 1, 1), F(1, 1)}));
  EXPECT_EQ(fo[1], (List{PA(0, 0, 0), WA(0, 0, 0), F(0, 0), F(1, 1), SA(1, 1, 0)}));
}

TEST(Placement, SplitBackwardInTheChecker) {
  const ScheduleSpec spec{"zb", 2, 1, 1};
  const Schedule s = with_communication(spec, {{F(0), I(0), W(0)}, {F(0), I(0), W(0)}});
  // The input gradient goes out as soon as backward_input has it; the weight half sends nothing.
  EXPECT_EQ(s[0], (List{PG(0, 0, 1), F(0), SA(0, 0, 1), WG(0, 0, 1), I(0), W(0), STEP()}));
  EXPECT_EQ(s[1], (List{PA(0, 0, 0), WA(0, 0, 0), F(0), I(0), SG(0, 0, 0), W(0), STEP()}));
  EXPECT_EQ(check_error(spec, s), "(passed)");
  EXPECT_EQ(compute_summary(s[1], 1), "F0 I0 W0");
  EXPECT_EQ(peak_in_flight(s[1]), 1);
  EXPECT_NE(check_error(spec, with_communication(spec, {{F(0), W(0), I(0)}, {F(0), I(0), W(0)}}))
                .find("backward_weight before the backward_input"),
            std::string::npos);
  EXPECT_NE(check_error(spec, with_communication(spec, {{F(0), I(0)}, {F(0), I(0), W(0)}}))
                .find("its weight gradient is never computed"),
            std::string::npos);
  EXPECT_NE(check_error(spec, with_communication(spec, {{F(0), B(0), W(0)}, {F(0), B(0)}}))
                .find("weight gradient a second time"),
            std::string::npos);
}

}  // namespace
