// check_schedule (parallel/pipeline/schedule_check.h): every generated schedule passes over the whole sweep,
// and each kind of broken list is caught with a message that says what is wrong, so the checker itself is
// tested.
//
// Legend: p stages (ranks), m micro-batches, V chunks per rank, i micro-batch, j rank, c chunk.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "actions.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_generator.h"

namespace {

using namespace mt::pipeline;
using namespace mt::pipeline::test;

#define EXPECT_CHECK_FAILS(spec, sched, needle)                                  \
  do {                                                                           \
    std::string msg_ = check_error(spec, sched);                                 \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_;     \
  } while (0)

TEST(ScheduleCheck, EveryScheduleIsConsistentAndDeadlockFree) {
  // The sweep of issue 5: p in 1..4, m in 1..9, V in 1..3, where the spec is valid.
  int checked = 0;
  for (const std::string name : {"gpipe", "1f1b", "interleaved"}) {
    for (int p = 1; p <= 4; p++) {
      for (int m = 1; m <= 9; m++) {
        for (int V = 1; V <= 3; V++) {
          const bool valid = name == "interleaved" ? V >= 2 && m % p == 0 : V == 1;
          if (!valid) continue;
          const ScheduleSpec spec{name, p, m, V};
          EXPECT_EQ(check_error(spec, make_schedule(spec)), "(passed)") << name << " p=" << p << " m=" << m
                                                                        << " V=" << V;
          checked++;
        }
      }
    }
  }
  // gpipe and 1f1b: 4 * 9 each; interleaved with V = 2, 3: m % p == 0 gives 9 + 4 + 3 + 2 = 18 per V.
  EXPECT_EQ(checked, 36 + 36 + 36);
}

TEST(ScheduleCheck, SwappedSendOrderIsCaught) {
  // GPipe p = 2, m = 2, rank 0: [F0 SA0] [PG0 F1 SA1] ... Running micro-batch 1 first sends 1 before 0,
  // while rank 1 posts 0 before 1: FIFO matching would hand micro-batch 1's activation to micro-batch 0.
  const ScheduleSpec spec{"gpipe", 2, 2, 1};
  Schedule s = make_schedule(spec);
  ASSERT_EQ(s[0][0], F(0));
  ASSERT_EQ(s[0][3], F(1));
  std::swap(s[0][0], s[0][3]);
  std::swap(s[0][1], s[0][4]);
  EXPECT_CHECK_FAILS(spec, s, "rank 0 -> rank 1 activations: message #0 sent is activation of micro-batch 1");
  EXPECT_CHECK_FAILS(spec, s, "rank 1 must post its receives in the order rank 0 sends");
}

TEST(ScheduleCheck, SwappedReceiveOrderIsCaught) {
  // 1F1B p = 2, m = 3, rank 1 posts the activation of micro-batch 2 before that of micro-batch 1.
  const ScheduleSpec spec{"1f1b", 2, 3, 1};
  Schedule s = make_schedule(spec);
  auto& r1 = s[1];
  for (Action& a : r1) {  // relabel every action of micro-batch 1 as 2 and back: the compute order changes
    if (a.micro_batch == 1) a.micro_batch = 2;
    else if (a.micro_batch == 2) a.micro_batch = 1;
  }
  EXPECT_CHECK_FAILS(spec, s, "rank 0 -> rank 1 activations: message #1 sent is activation of micro-batch 1");
}

TEST(ScheduleCheck, DeadlockIsCaught) {
  // Rank 0 waits for the gradient of micro-batch 0 before it sends the activation of micro-batch 1; rank 1
  // wants both forwards before its first backward. Every FIFO order matches; only the replay sees the cycle.
  const ScheduleSpec spec{"custom", 2, 2, 1};
  const Schedule s = with_communication(spec, {{F(0), B(0), F(1), B(1)}, {F(0), F(1), B(0), B(1)}});
  const std::string msg = check_error(spec, s);
  EXPECT_NE(msg.find("deadlock: rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wait_recv_grad(i=0, c=0, from=1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1, action"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wait_recv_act(i=1, c=0, from=0)"), std::string::npos) << msg;
  // The same compute orders the other way round are fine (rank 1 then does 1F1B, rank 0 GPipe-like).
  EXPECT_EQ(check_error(spec, with_communication(spec, {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), B(1)}})),
            "(passed)");
}

TEST(ScheduleCheck, BrokenListsOnOneRankAreCaught) {
  const ScheduleSpec spec{"1f1b", 2, 3, 1};
  const Schedule good = make_schedule(spec);
  auto edited = [&](int j, auto edit) {
    Schedule s = good;
    edit(s[j]);
    return s;
  };
  auto find = [](const std::vector<Action>& list, const Action& a) {
    for (size_t k = 0; k < list.size(); k++)
      if (list[k] == a) return (long)k;
    ADD_FAILURE() << "no " << to_string(a);
    return 0L;
  };
  // A wait removed: the forward would read a buffer that has not arrived.
  EXPECT_CHECK_FAILS(spec, edited(1, [&](auto& l) {
                       l.erase(l.begin() + find(l, {ActionKind::wait_recv_act, 1, 0, 0}));
                     }),
                     "rank 1, action 6 (forward(i=1, c=0)): forward before its input activation is received");
  // A wait before its post.
  EXPECT_CHECK_FAILS(spec, edited(1, [&](auto& l) {
                       l.erase(l.begin() + find(l, {ActionKind::post_recv_act, 1, 0, 0}));
                       l.insert(l.begin() + find(l, F(1)), {ActionKind::post_recv_act, 1, 0, 0});
                     }),
                     "waits for a receive that was not posted before");
  // Backward before forward.
  EXPECT_CHECK_FAILS(spec, edited(1, [&](auto& l) { std::swap(l[find(l, F(0))], l[find(l, B(0))]); }),
                     "backward before the forward of the same micro-batch and chunk");
  // A forward twice, and then one missing.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l[find(l, F(2))] = F(1); }), "forward a second time");
  // A backward dropped.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l.erase(l.begin() + find(l, B(2))); }),
                     "rank 0, micro-batch 2, chunk 0 (stage 0): never backwarded");
  // A send dropped.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l.erase(l.begin() + find(l, {ActionKind::send_act, 2, 0, 1})); }),
                     "rank 0, micro-batch 2, chunk 0 (stage 0): the activation is never sent");
  // A send to the wrong rank, and a send of something never computed.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l[find(l, {ActionKind::send_act, 0, 0, 1})].peer = 0; }),
                     "the peer must be rank 1, which holds stage 1");
  EXPECT_CHECK_FAILS(spec, edited(1, [&](auto& l) { l.insert(l.begin(), {ActionKind::send_grad, 0, 0, 0}); }),
                     "sends a gradient before the backward that computes it");
  // Stage 0 has nothing to receive; the last stage nothing to send onwards.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l.insert(l.begin(), {ActionKind::post_recv_act, 0, 0, 1}); }),
                     "stage 0 has no stage -1 to receive an activation from");
  EXPECT_CHECK_FAILS(spec, edited(1, [&](auto& l) { l.push_back({ActionKind::send_act, 0, 0, 0}); }),
                     "an action after optimizer_step");
  // Out of range, no step, wrong number of lists.
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l[0].micro_batch = 3; }), "micro-batch out of range [0, 3)");
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l[0].chunk = 1; }), "chunk out of range [0, 1)");
  EXPECT_CHECK_FAILS(spec, edited(0, [&](auto& l) { l.pop_back(); }), "does not end with optimizer_step");
  const Schedule one_list{good.placement, ActionLists(good.lists.begin(), good.lists.begin() + 1)};
  EXPECT_CHECK_FAILS(spec, one_list, "1 lists for p = 2 ranks");
}

TEST(ScheduleCheck, LocalHandOverOnOneRank) {
  // p = 1, V = 2: stages 0 and 1 are both on rank 0, so chunk 1's forward must follow chunk 0's, and no
  // message may be sent for the hand-over.
  const ScheduleSpec spec{"interleaved", 1, 1, 2};
  EXPECT_EQ(check_error(spec, make_schedule(spec)), "(passed)");
  EXPECT_CHECK_FAILS(spec, with_communication(spec, {{F(0, 1), F(0, 0), B(0, 1), B(0, 0)}}),
                     "forward of stage 1 before the forward of stage 0 on this rank");
  EXPECT_CHECK_FAILS(spec, with_communication(spec, {{F(0, 0), F(0, 1), B(0, 0), B(0, 1)}}),
                     "backward of stage 0 before the backward of stage 1 on this rank");
  Schedule s = make_schedule(spec);
  s[0].insert(s[0].begin() + 1, {ActionKind::send_act, 0, 0, 0});
  EXPECT_CHECK_FAILS(spec, s, "stage 1 is on this rank too: the tensor is handed over in memory, not sent");
}

// make_schedule runs the checker on what a generator built: a generator whose compute order does not fit its own
// placement fails when the schedule is made, with the schedule's name, p, m, V and the checker's rule in the
// message, instead of in a wait at run time.
class ForgetsLastBackward : public ScheduleGenerator {
 public:
  const char* name() const override { return "forgets-last-backward"; }
  void validate(const ScheduleSpec&) const override {}
  ActionLists compute_order(const ScheduleSpec& spec, const Placement& placement) const override {
    ActionLists out = find_schedule("1f1b").compute_order(spec, placement);
    if (drop) out[0].pop_back();  // rank 0's last backward
    return out;
  }
  bool drop = true;
};

TEST(ScheduleCheck, MakeScheduleChecksTheGeneratorsList) {
  const ScheduleSpec spec{"forgets-last-backward", 2, 3, 1};
  ForgetsLastBackward gen;
  try {
    make_schedule(spec, gen);
    FAIL() << "a list without rank 0's last backward was accepted";
  } catch (const ScheduleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("pipeline schedule forgets-last-backward (p = 2, m = 3, V = 1) built a list that fails the "
                       "schedule check: rank 0"),
              std::string::npos)
        << msg;
  }
  gen.drop = false;  // the same generator without the fault: 1F1B's lists, accepted
  EXPECT_EQ(make_schedule(spec, gen).lists, make_schedule({"1f1b", 2, 3, 1}).lists);
}

}  // namespace
