// Schedules that update after every micro-batch (schedules/pipedream.cpp, pipemare.cpp): 1F1B's compute order
// with an optimizer_step(i) right after each backward of micro-batch i and its send, written out by hand for
// p = 2, m = 3; the checker passes a sweep of them and refuses lists that update before the backward, twice,
// not at all, or mix the step-end update in; the generators' weight rule.
//
// Legend: p stages (ranks), m micro-batches, i micro-batch, j rank; U(i) the update after micro-batch i.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "actions.h"
#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {
void PrintTo(const Action& a, std::ostream* os);  // schedule_test.cpp
}  // namespace mt::pipeline

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

Action U(int i) { return {ActionKind::optimizer_step, i, 0, -1}; }

TEST(MicroUpdateSchedule, PipeDreamTwoStagesThreeMicroBatchesWholeLists) {
  for (const char* name : {"pipedream", "pipemare"}) {
    const Schedule s = make_schedule({name, 2, 3, 1});
    ASSERT_EQ(s.size(), 2u);
    // Rank 0: warm-up 1; the update of i after B(i) (stage 0 sends nothing back).
    EXPECT_EQ(s[0], (std::vector<Action>{F(0), SA(0, 0, 1),                       //
                                         PG(0, 0, 1), F(1), SA(1, 0, 1),          //
                                         WG(0, 0, 1), B(0), U(0),                 //
                                         PG(1, 0, 1), F(2), SA(2, 0, 1),          //
                                         WG(1, 0, 1), PG(2, 0, 1), B(1), U(1),    //
                                         WG(2, 0, 1), B(2), U(2)}))
        << name;
    // Rank 1 (last stage): F B U; the update after the gradient's send, so the previous stage never waits
    // for this rank's update.
    EXPECT_EQ(s[1], (std::vector<Action>{PA(0, 0, 0), WA(0, 0, 0), F(0),          //
                                         PA(1, 0, 0), B(0), SG(0, 0, 0), U(0),    //
                                         WA(1, 0, 0), F(1),                       //
                                         PA(2, 0, 0), B(1), SG(1, 0, 0), U(1),    //
                                         WA(2, 0, 0), F(2), B(2), SG(2, 0, 0), U(2)}))
        << name;
    EXPECT_EQ(compute_summary(s[0], 1), "F0 F1 B0 F2 B1 B2") << name;  // 1F1B's order
  }
}

TEST(MicroUpdateSchedule, CheckerPassesASweep) {
  for (const char* name : {"pipedream", "pipemare"})
    for (int p : {2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 9}) {
        const ScheduleSpec spec{name, p, m, 1};
        const Schedule s = make_schedule(spec);
        EXPECT_EQ(check_error(spec, s), "(passed)") << name << " p " << p << " m " << m;
        for (int j = 0; j < p; j++) {
          int updates = 0;
          for (const Action& a : s[j]) updates += a.kind == ActionKind::optimizer_step;
          EXPECT_EQ(updates, m) << name << " p " << p << " m " << m << " j " << j;
          EXPECT_EQ(s[j].back(), U(m - 1));
          // The compute order is 1F1B's.
          EXPECT_EQ(compute_summary(s[j], 1), compute_summary(make_schedule({"1f1b", p, m, 1})[j], 1));
        }
      }
}

TEST(MicroUpdateSchedule, CheckerRefusesBrokenUpdates) {
  const ScheduleSpec spec{"pipedream", 2, 2, 1};
  const Schedule good = make_schedule(spec);
  auto find = [&](const Schedule& s, int j, const Action& a) {
    for (size_t k = 0; k < s[j].size(); k++)
      if (s[j][k] == a) return k;
    ADD_FAILURE() << "no " << to_string(a);
    return size_t(0);
  };
  {  // the update of micro-batch 0 before its backward
    Schedule s = good;
    const size_t k = find(s, 1, U(0));
    std::swap(s[1][k], s[1][k - 2]);  // ... U(0) B(0) SG(0) on the last rank
    EXPECT_NE(check_error(spec, s).find("optimizer_step of a micro-batch before its backward"), std::string::npos)
        << check_error(spec, s);
  }
  {  // one update missing
    Schedule s = good;
    s[0].erase(s[0].begin() + (long)find(s, 0, U(0)));
    EXPECT_NE(check_error(spec, s).find("no optimizer_step after its backward"), std::string::npos)
        << check_error(spec, s);
  }
  {  // an update twice
    Schedule s = good;
    s[0].push_back(U(1));
    EXPECT_NE(check_error(spec, s).find("a second time"), std::string::npos) << check_error(spec, s);
  }
  {  // the step-end update in a list of per-micro-batch ones
    Schedule s = good;
    s[0].push_back(STEP());
    EXPECT_NE(check_error(spec, s).find("step-end optimizer_step"), std::string::npos) << check_error(spec, s);
  }
}

TEST(MicroUpdateSchedule, WeightRuleAndRefusals) {
  using M = ScheduleGenerator::MicroUpdates;
  for (const std::string& name : schedule_names()) {
    const M want = name == "pipedream" ? M::stashed : name == "pipemare" ? M::newest : M::none;
    EXPECT_EQ(find_schedule(name).micro_updates(), want) << name;
  }
  EXPECT_EQ(find_schedule("pipedream").weight_versions(), 1);  // not the delay-1 rule
  EXPECT_THROW(validate({"pipedream", 2, 4, 2}), mt::InputError);
  EXPECT_THROW(validate({"pipemare", 2, 4, 2}), mt::InputError);
}

}  // namespace
