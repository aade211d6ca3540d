// DivergenceGuard on hand-written loss sequences: where it fires, where it must not, and its off switch.
#include "train/divergence_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mt::train {
namespace {

// Feeds losses as steps 1, 2, ...; returns the step of the first verdict (0: none) and keeps it.
int64_t first_verdict(DivergenceGuard& g, const std::vector<double>& losses, DivergenceVerdict* out = nullptr) {
  for (size_t i = 0; i < losses.size(); i++) {
    if (auto v = g.observe((int64_t)i + 1, losses[i])) {
      if (out) *out = *v;
      return (int64_t)i + 1;
    }
  }
  return 0;
}

TEST(DivergenceGuard, BlowUpAtOnceIsJudgedAgainstTheFirstLoss) {
  DivergenceGuard g(10, 5);
  DivergenceVerdict v;
  // The run: 4.17 then 1e7 and more.
  EXPECT_EQ(first_verdict(g, {4.17, 3.8e7, 8.1e7, 6.7e7, 9.3e7, 7.5e7, 5.5e7}, &v), 6);
  EXPECT_EQ(v.first_step, 2);
  EXPECT_EQ(v.step, 6);
  EXPECT_DOUBLE_EQ(v.median, 4.17);
  EXPECT_DOUBLE_EQ(v.loss, 7.5e7);
  EXPECT_NE(v.message.find("at step 6"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("since step 2"), std::string::npos) << v.message;
}

TEST(DivergenceGuard, SpikesShorterThanTheWindowAreTolerated) {
  DivergenceGuard g(10, 3);
  std::vector<double> l;
  for (int i = 0; i < 20; i++) l.push_back(3.0 - 0.05 * i);
  l.insert(l.begin() + 8, {100, 100});  // two high steps, then normal again
  l.insert(l.begin() + 15, {200, 200});
  EXPECT_EQ(first_verdict(g, l), 0);
  // Three in a row fire, at the third.
  EXPECT_EQ(first_verdict(g, {300, 300, 300}), 3);
}

TEST(DivergenceGuard, SmallLossesNeedTheAbsoluteMarginToo) {
  // Near convergence 1e-4 -> 5e-3 is 50x but only 0.005 nats: not divergence.
  DivergenceGuard g(10, 2);
  std::vector<double> l(30, 1e-4);
  for (int i = 10; i < 30; i++) l[i] = 5e-3;
  EXPECT_EQ(first_verdict(g, l), 0);
  // 0.2 -> 1.5: above 10 x 0.2 = 2? no; 0.2 -> 2.5: above 10x and above median + 1: yes.
  DivergenceGuard h(10, 2);
  EXPECT_EQ(first_verdict(h, {0.2, 0.2, 1.5, 1.5, 1.5}), 0);
  DivergenceGuard k(10, 2);
  EXPECT_EQ(first_verdict(k, {0.2, 0.2, 2.5, 2.5}), 4);
}

TEST(DivergenceGuard, MedianFollowsTheRunAndHighStepsStayOutOfIt) {
  DivergenceGuard g(4, 3);
  // The median of the good losses is 2: 9 is high (> 8 and > 3), 7 is not.
  EXPECT_EQ(first_verdict(g, {2, 2, 2, 9, 9, 7, 9, 9, 9}), 9);
}

TEST(DivergenceGuard, SlowCreepIsCaughtAgainstTheLowestMedian) {
  // x1.3 per step: each loss is under 10x the median of the ones before it only because that median rises too.
  DivergenceGuard g(10, 5);
  std::vector<double> l;
  double x = 4;
  for (int i = 0; i < 60; i++, x *= 1.3) l.push_back(x);
  DivergenceVerdict v;
  const int64_t at = first_verdict(g, l, &v);
  ASSERT_GT(at, 0);
  EXPECT_DOUBLE_EQ(v.median, 4);
  // 4 * 1.3^k > 40 first at k = 9 (step 10); five in a row end at step 14.
  EXPECT_EQ(v.first_step, 10);
  EXPECT_EQ(at, 14);
}

TEST(DivergenceGuard, FactorZeroIsOff) {
  DivergenceGuard g(0, 1);
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(first_verdict(g, {1, 1e9, 1e9, 1e9, 1e9}), 0);
}

}  // namespace
}  // namespace mt::train
