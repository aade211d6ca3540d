// The step tail (train/step_tail.h), the end of every optimizer step in every loop: the divergence checks in
// the order added (the first to fail stops the step before anything is scaled), clipping exactly when
// norm + 1e-6 > clip with factor clip / (norm + 1e-6), and the schedule's learning rate.
#include "train/step_tail.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace {

using mt::train::StepTail;

// Records each call as "<name>@<step>"; throws DivergedError at step `fail_at`.
class Probe : public mt::train::DivergenceCheck {
 public:
  Probe(std::string name, std::vector<std::string>* log, int64_t fail_at = -1)
      : name_(std::move(name)), log_(log), fail_at_(fail_at) {}
  void check(int64_t s, double, double) override {
    log_->push_back(name_ + "@" + std::to_string(s));
    if (s == fail_at_) throw mt::DivergedError(name_ + " failed");
  }

 private:
  std::string name_;
  std::vector<std::string>* log_;
  int64_t fail_at_;
};

mt::optim::LrSchedule schedule() { return {0.5, 0.125, 2, 6}; }  // lr, min_lr, warmup, total

TEST(StepTail, ChecksInOrderThenClipThenLearningRate) {
  std::vector<std::string> log;
  StepTail tail(1.0, schedule());
  tail.add_check(std::make_unique<Probe>("a", &log));
  tail.add_check(std::make_unique<Probe>("b", &log, /*fail_at=*/3));
  std::vector<float> scaled;
  auto scale = [&](float f) { scaled.push_back(f); };
  // Under the clip: no scaling; warm-up lr (s + 1) / W x lr.
  EXPECT_EQ(tail.finish(0, 2.0, 0.5, scale), 0.25f);
  EXPECT_TRUE(scaled.empty());
  // Over it: one scaling by clip / (norm + 1e-6), after the checks.
  EXPECT_EQ(tail.finish(1, 2.0, 4.0, scale), 0.5f);
  ASSERT_EQ(scaled.size(), 1u);
  EXPECT_EQ(scaled[0], (float)(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(tail.clip_factor(4.0), scaled[0]);
  EXPECT_EQ(tail.clip_factor(1.0 - 2e-6), 1.0f);  // norm + 1e-6 <= clip: untouched
  // Just under the clip but over it with the 1e-6: scaled (slightly).
  tail.finish(1, 2.0, 1.0 - 5e-7, scale);
  ASSERT_EQ(scaled.size(), 2u);
  EXPECT_EQ(scaled[1], (float)(1.0 / (1.0 + 5e-7)));
  EXPECT_LT(scaled[1], 1.0f);
  scaled.pop_back();
  log.resize(log.size() - 2);
  // The schedule past its end: min_lr.
  EXPECT_EQ(tail.finish(7, 2.0, 0.5, scale), 0.125f);
  // A failing check stops the step: the later ones and the scaling do not run.
  EXPECT_THROW(tail.finish(3, 2.0, 4.0, scale), mt::DivergedError);
  EXPECT_EQ(scaled.size(), 1u);
  EXPECT_EQ(log, (std::vector<std::string>{"a@0", "b@0", "a@1", "b@1", "a@7", "b@7", "a@3", "b@3"}));
}

TEST(StepTail, NoClipWhenOff) {
  StepTail tail(0.0, schedule());
  bool called = false;
  tail.finish(2, 1.0, 1e30, [&](float) { called = true; });
  EXPECT_FALSE(called);
  EXPECT_EQ(tail.clip_factor(1e30), 1.0f);
}

TEST(StepTail, NonFiniteNamesWhatAndWhereWithAdvice) {
  mt::train::NonFiniteCheck plain;
  EXPECT_NO_THROW(plain.check(4, 1.5, 2.5));
  try {
    plain.check(4, std::numeric_limits<double>::quiet_NaN(), 2.5);
    FAIL() << "NaN loss passed";
  } catch (const mt::DivergedError& e) {
    EXPECT_NE(std::string(e.what()).find("loss is nan at step 5; training stopped (try a lower --lr or --grad-clip)"),
              std::string::npos)
        << e.what();
  }
  mt::train::NonFiniteCheck named([](int64_t s) { return "update " + std::to_string(s); },
                                  [](int64_t) { return std::string(". See checkpoint X"); });
  try {
    named.check(4, 1.0, std::numeric_limits<double>::infinity());
    FAIL() << "infinite norm passed";
  } catch (const mt::DivergedError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient norm is inf at update 4; training stopped. See checkpoint X"),
              std::string::npos)
        << e.what();
  }
}

TEST(StepTail, SpikeCheckStopsAfterTheWindowAndAdvisesFromTheFirstHighStep) {
  int64_t advised = -1;
  mt::train::SpikeCheck spike(10, 2, [&](int64_t s) {
    advised = s;
    return std::string();
  });
  for (int64_t s = 0; s < 5; s++) spike.check(s, 2.0, 1.0);
  spike.check(5, 100.0, 1.0);  // one high step: not yet
  EXPECT_THROW(spike.check(6, 100.0, 1.0), mt::DivergedError);
  EXPECT_EQ(advised, 5);  // 0-based first high step
  mt::train::SpikeCheck off(0, 2);
  for (int64_t s = 0; s < 5; s++) off.check(s, s < 2 ? 1.0 : 1e9, 1.0);  // factor 0: never stops
}

}  // namespace
