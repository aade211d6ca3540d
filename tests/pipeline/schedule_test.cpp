// Pipeline schedules as pure functions: written-out action lists for small cases (derived by hand from each
// schedule's definition), the simulator's utilization against the closed forms, the checker on every valid
// (schedule, p, m, V) and on deliberately broken lists, and 1F1B's activation-memory bound.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "plan/simulator.h"

using mt::pipeline::Action;
using mt::pipeline::ActionKind;
using mt::pipeline::ScheduleSpec;

namespace {

// Compute actions only, as "F0 B0 ..." (chunk appended as ".c" when V > 1).
std::string compute_string(const std::vector<Action>& list, bool chunks = false) {
  std::string s;
  for (const Action& a : list) {
    if (a.kind != ActionKind::forward && a.kind != ActionKind::backward) continue;
    if (!s.empty()) s += " ";
    s += (a.kind == ActionKind::forward ? "F" : "B") + std::to_string(a.micro_batch);
    if (chunks) s += "." + std::to_string(a.chunk);
  }
  return s;
}

constexpr ActionKind F = ActionKind::forward, Bk = ActionKind::backward, RA = ActionKind::recv_act,
                     SA = ActionKind::send_act, RG = ActionKind::recv_grad, SG = ActionKind::send_grad;

}  // namespace

TEST(Schedule, GpipeTwoStagesTwoMicroBatchesWrittenOut) {
  auto r = mt::pipeline::make_schedule({"gpipe", 2, 2, 1});
  std::vector<Action> rank0 = {{F, 0, 0, -1}, {SA, 0, 0, 1}, {F, 1, 0, -1}, {SA, 1, 0, 1},
                               {RG, 0, 0, 1}, {Bk, 0, 0, -1}, {RG, 1, 0, 1}, {Bk, 1, 0, -1}};
  std::vector<Action> rank1 = {{RA, 0, 0, 0}, {F, 0, 0, -1}, {RA, 1, 0, 0}, {F, 1, 0, -1},
                               {Bk, 0, 0, -1}, {SG, 0, 0, 0}, {Bk, 1, 0, -1}, {SG, 1, 0, 0}};
  EXPECT_EQ(r[0], rank0);
  EXPECT_EQ(r[1], rank1);
}

TEST(Schedule, OneFOneBTwoStagesThreeMicroBatchesWrittenOut) {
  auto r = mt::pipeline::make_schedule({"1f1b", 2, 3, 1});
  // Rank 0 warms up with p - j - 1 = 1 forward; the last rank alternates from the start.
  EXPECT_EQ(compute_string(r[0]), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(compute_string(r[1]), "F0 B0 F1 B1 F2 B2");
  std::vector<Action> rank1 = {{RA, 0, 0, 0}, {F, 0, 0, -1}, {Bk, 0, 0, -1}, {SG, 0, 0, 0},
                               {RA, 1, 0, 0}, {F, 1, 0, -1}, {Bk, 1, 0, -1}, {SG, 1, 0, 0},
                               {RA, 2, 0, 0}, {F, 2, 0, -1}, {Bk, 2, 0, -1}, {SG, 2, 0, 0}};
  EXPECT_EQ(r[1], rank1);
}

TEST(Schedule, InterleavedTwoStagesTwoChunksWrittenOut) {
  // p = 2, m = 2, V = 2: forward units visit chunk 0 for micro-batches 0, 1, then chunk 1 for 0, 1;
  // rank 0 warms up with (p-1)*2 + (V-1)*p = 4 units (all of its forwards), rank 1 with 2.
  auto r = mt::pipeline::make_schedule({"interleaved", 2, 2, 2});
  EXPECT_EQ(compute_string(r[0], true), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  EXPECT_EQ(compute_string(r[1], true), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0");
  mt::pipeline::check_schedule({"interleaved", 2, 2, 2}, r);
}

TEST(Simulator, GpipeUtilizationMatchesTheDesignNumbers) {
  mt::plan::CostModel cost{1.0, 2.0, 0.0};
  struct Case { int m; double util; double busy_cells, all_cells; };
  for (Case c : {Case{1, 0.25, 12, 48}, Case{4, 48.0 / 84, 48, 84}, Case{8, 96.0 / 132, 96, 132}}) {
    ScheduleSpec spec{"gpipe", 4, c.m, 1};
    auto sim = mt::plan::simulate(spec, mt::pipeline::make_schedule(spec), cost);
    EXPECT_NEAR(sim.utilization, c.util, 1e-12) << "m=" << c.m;
    EXPECT_DOUBLE_EQ(sim.busy, c.busy_cells) << "m=" << c.m;
    EXPECT_DOUBLE_EQ(sim.makespan * 4, c.all_cells) << "m=" << c.m;
  }
}

TEST(Simulator, BubbleIsClosedFormForGpipeAndOneFOneB) {
  for (const char* name : {"gpipe", "1f1b"})
    for (int p = 1; p <= 4; p++)
      for (int m = 1; m <= 9; m++)
        for (double ratio : {1.0, 2.0, 3.0}) {
          ScheduleSpec spec{name, p, m, 1};
          auto sim = mt::plan::simulate(spec, mt::pipeline::make_schedule(spec), {1.0, ratio, 0.0});
          EXPECT_NEAR(sim.bubble, double(p - 1) / (m + p - 1), 1e-12) << name << " p=" << p << " m=" << m;
        }
}

TEST(Simulator, InterleavingShrinksTheBubble) {
  for (int p = 2; p <= 4; p++)
    for (int V = 2; V <= 3; V++)
      for (int m = p; m <= 9; m += p) {
        ScheduleSpec il{"interleaved", p, m, V}, plain{"1f1b", p, m, 1};
        double b_il = mt::plan::simulate(il, mt::pipeline::make_schedule(il), {}).bubble;
        double b_1 = mt::plan::simulate(plain, mt::pipeline::make_schedule(plain), {}).bubble;
        EXPECT_LT(b_il, b_1) << "p=" << p << " m=" << m << " V=" << V;
        EXPECT_NEAR(b_il, double(p - 1) / (V * m + p - 1), 0.02) << "p=" << p << " m=" << m << " V=" << V;
      }
}

TEST(Schedule, EveryValidScheduleChecksOut) {
  int checked = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved"})
    for (int p = 1; p <= 4; p++)
      for (int m = 1; m <= 9; m++)
        for (int V = 1; V <= 3; V++) {
          ScheduleSpec spec{name, p, m, V};
          try {
            spec.validate();
          } catch (const mt::InputError&) {
            continue;
          }
          EXPECT_NO_THROW(mt::pipeline::check_schedule(spec, mt::pipeline::make_schedule(spec)))
              << name << " p=" << p << " m=" << m << " V=" << V;
          checked++;
        }
  EXPECT_EQ(checked, 36 + 36 + 36);  // gpipe and 1f1b: 4 x 9; interleaved: m a multiple of p, V 2-3
}

TEST(Schedule, CheckerCatchesBrokenLists) {
  ScheduleSpec spec{"1f1b", 2, 3, 1};
  auto good = mt::pipeline::make_schedule(spec);
  // Rank 1 waits for micro-batch 1's activation before micro-batch 0's: a cycle with rank 0, which needs
  // micro-batch 0's gradient first.
  auto swapped = good;
  std::swap(swapped[1][0], swapped[1][4]);
  EXPECT_THROW(mt::pipeline::check_schedule(spec, swapped), mt::Error);
  // A missing backward.
  auto missing = good;
  missing[0].pop_back();
  EXPECT_THROW(mt::pipeline::check_schedule(spec, missing), mt::Error);
  // A send to the wrong peer.
  auto wrong = good;
  wrong[0][1].peer = 0;
  EXPECT_THROW(mt::pipeline::check_schedule(spec, wrong), mt::Error);
}

// Activations held = forwards minus backwards so far; 1F1B bounds it by p - j on rank j, GPipe reaches m.
TEST(Schedule, OneFOneBBoundsActivationsInFlight) {
  const int p = 4, m = 8;
  for (const char* name : {"1f1b", "gpipe"}) {
    auto r = mt::pipeline::make_schedule({name, p, m, 1});
    for (int j = 0; j < p; j++) {
      int live = 0, peak = 0;
      for (const Action& a : r[j]) {
        live += a.kind == F ? 1 : a.kind == Bk ? -1 : 0;
        peak = std::max(peak, live);
      }
      EXPECT_EQ(peak, std::string(name) == "1f1b" ? p - j : m) << name << " rank " << j;
    }
  }
}

TEST(Schedule, InvalidSpecsNameTheValues) {
  try {
    ScheduleSpec{"interleaved", 4, 6, 2}.validate();
    FAIL();
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("(6) divisible by the pipeline ranks (4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW((ScheduleSpec{"pipedream", 2, 2, 1}.validate()), mt::InputError);
  EXPECT_THROW((ScheduleSpec{"1f1b", 2, 2, 2}.validate()), mt::InputError);
}

TEST(SimulateCli, PrintsUtilizationAndWritesSvg) {
  std::string svg = ::testing::TempDir() + "/sim_test.svg";
  std::string cmd = std::string(MESHTRAIN_BIN) + " simulate --schedule gpipe --stages 4 --micro-batches 4 --svg " +
                    svg + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  ASSERT_TRUE(pipe);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe.get())) out += buf;
  EXPECT_NE(out.find("utilization 57.1%"), std::string::npos) << out;
  FILE* f = fopen(svg.c_str(), "r");
  ASSERT_TRUE(f) << "no SVG written";
  std::string body;
  while (fgets(buf, sizeof buf, f)) body += buf;
  fclose(f);
  EXPECT_EQ(body.rfind("<svg", 0), 0u);
  EXPECT_NE(body.find("</svg>"), std::string::npos);
  // 4 ranks x 4 micro-batches x (forward + backward) boxes, plus lane outlines.
  size_t boxes = 0;
  for (size_t pos = 0; (pos = body.find("fill=\"#4C78A8\"", pos)) != std::string::npos; pos++) boxes++;
  EXPECT_EQ(boxes, 16u);
  std::remove(svg.c_str());
}
