// The registry of schedule generators (parallel/pipeline/schedule_generator.h, schedules/registry.cpp): each
// generator is found by its name, an unknown name is refused with the known ones listed, and a generator's
// choices (validation, placement, compute order) are what make_schedule uses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace {

using namespace mt::pipeline;

TEST(ScheduleRegistry, FindsEachGeneratorByName) {
  EXPECT_EQ(schedule_names(), (std::vector<std::string>{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v",
                                                  "pipedream-2bw", "chimera", "pipedream", "pipemare"}));
  for (const std::string& name : schedule_names()) EXPECT_EQ(find_schedule(name).name(), name);
}

TEST(ScheduleRegistry, UnknownNameListsTheKnownOnes) {
  try {
    find_schedule("zero-bubble");
    FAIL() << "no error";
  } catch (const mt::InputError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown pipeline schedule 'zero-bubble'; choose one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, "
                 "pipedream-2bw, chimera, pipedream, pipemare");
  }
  EXPECT_THROW(validate({"Gpipe", 2, 2, 1}), mt::InputError);  // names are exact
}

TEST(ScheduleRegistry, MakeScheduleIsTheGeneratorsOrderPlusMessages) {
  for (const ScheduleSpec& spec :
       {ScheduleSpec{"gpipe", 3, 4, 1}, ScheduleSpec{"1f1b", 3, 4, 1}, ScheduleSpec{"interleaved", 2, 4, 3}}) {
    const ScheduleGenerator& g = find_schedule(spec.name);
    const Placement pl = g.placement(spec);
    const Schedule s = make_schedule(spec);
    EXPECT_EQ(s.placement, pl) << spec.name;
    EXPECT_EQ(s.lists, with_communication(pl, g.compute_order(spec, pl)).lists) << spec.name;
  }
}

}  // namespace

// PipeDream-2BW is 1F1B's compute order with the delay-1 rule's two weight versions; the others keep one.
TEST(ScheduleRegistry, PipeDream2BwIsOneFOneBsOrderWithTwoWeightVersions) {
  for (const auto& [p, m] : {std::pair{2, 1}, std::pair{2, 4}, std::pair{3, 5}, std::pair{4, 8}}) {
    const Schedule s = make_schedule({"pipedream-2bw", p, m, 1});
    EXPECT_EQ(s.lists, make_schedule({"1f1b", p, m, 1}).lists) << "p " << p << " m " << m;
  }
  EXPECT_THROW(validate({"pipedream-2bw", 2, 4, 2}), mt::InputError);
  for (const std::string& name : schedule_names())
    EXPECT_EQ(find_schedule(name).weight_versions(), name == "pipedream-2bw" ? 2 : 1) << name;
}
