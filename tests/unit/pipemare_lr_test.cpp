// PipeMare's learning-rate rescheduling: the per-segment learning-rate wrapper against plain calls of the
// wrapped optimizer, and the factor against values worked out by hand from the rule in docs/parallelism.md.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "nn/params.h"
#include "optim/optimizer.h"
#include "optim/scaled_lr_optimizer.h"
#include "train/pipemare.h"

using mt::optim::Segment;

// tau_j = p - j; the power 1 - min(n/K, 1) falls from 1 to 0 over K updates.
TEST(PipeMareLr, FactorByStageAndUpdate) {
  using mt::train::pipemare_lr_factor;
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 0, false, 0, 10), 0.25);     // 4^-1
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 1, false, 0, 10), 1.0 / 3);  // 3^-1
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 3, false, 0, 10), 1.0);      // 1^-1: the last stage keeps lr
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 0, false, 5, 10), 0.5);      // 4^-0.5
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(2, 0, false, 5, 10), 1.0 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 0, false, 10, 10), 1.0);
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 0, false, 99, 10), 1.0);
  // the tied embedding: stage 0's factor on the last stage too
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 3, true, 0, 10), 0.25);
  EXPECT_DOUBLE_EQ(pipemare_lr_factor(4, 3, true, 5, 10), 0.5);
}

// Two segments with factors 0.5 and 1: the wrapper's step equals the wrapped AdamW stepped on each segment
// alone with lr * factor, with the clipping scale applied to both.
TEST(PipeMareLr, WrapperEqualsPerSegmentCalls) {
  const size_t n = 4;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.1f}, q = p;
  mt::optim::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  auto inner = std::make_unique<mt::optim::AdamW>(n, cfg);
  mt::optim::AdamW plain(n, cfg);
  std::vector<Segment> segs = {{0, 0, 0, 2, true, 0}, {2, 2, 2, 2, false, 1}};
  mt::optim::ScaledLrOptimizer wrapped(std::move(inner), [](const Segment& s, int64_t step) {
    return s.tensor == 0 ? 0.5 / (double)(step + 1) : 1.0;
  });
  for (int s = 0; s < 4; s++) {
    std::vector<float> g = {0.3f * (s + 1), -0.2f, 0.05f * s, 1.0f};
    const float lr = 0.01f * (s + 1), clip = 0.75f;
    wrapped.scale_next_grads(clip);
    wrapped.step(p.data(), g.data(), segs, lr, s);
    plain.scale_next_grads(clip);
    plain.step(q.data(), g.data(), {segs[0]}, (float)((double)lr * 0.5 / (s + 1)), s);
    plain.scale_next_grads(clip);
    plain.step(q.data(), g.data(), {segs[1]}, lr, s);
    for (size_t i = 0; i < n; i++) EXPECT_EQ(p[i], q[i]) << "step " << s << " element " << i;
  }
  // and the factor mattered: unscaled AdamW ends elsewhere
  std::vector<float> r = {0.5f, -1.0f, 2.0f, 0.1f};
  mt::optim::AdamW base(n, cfg);
  for (int s = 0; s < 4; s++) {
    std::vector<float> g = {0.3f * (s + 1), -0.2f, 0.05f * s, 1.0f};
    base.scale_next_grads(0.75f);
    base.step(r.data(), g.data(), segs, 0.01f * (s + 1), s);
  }
  EXPECT_NE(p[0], r[0]);
  EXPECT_EQ(p[2], r[2]);
}

// The discrepancy correction on a 2-element stage, m = 2 (stage 0 of 2 under 1F1B: F0 F1 B0 U B1 U), values
// worked out by hand from the rule: delta = 0.5 delta + 0.5 (W(n+1) - W(n)) from 0; a backward whose forward
// read d versions ago sees W - d delta; every update is applied to the newest.
TEST(PipeMareCorrection, PredictsBackwardWeightsFromTheMovingAverage) {
  std::vector<float> a = {1.0f, 2.0f};
  mt::train::PipeMareVersions v(2, 0.5);
  v.bind(a.data(), a.size());
  auto update = [&](float x, float y) {
    v.before_update();
    a[0] += x;
    a[1] += y;
    v.after_update();
  };
  v.before_forward();
  v.before_micro_forward(0);  // reads version 0
  v.before_micro_forward(1);  // reads version 0
  v.before_micro_backward(0);  // d = 0: the newest
  EXPECT_EQ(a, (std::vector<float>{1.0f, 2.0f}));
  update(1.0f, -2.0f);  // W(1) = (2, 0); delta = (0.5, -1)
  EXPECT_EQ(v.delta()[0], 0.5f);
  EXPECT_EQ(v.delta()[1], -1.0f);
  v.before_micro_backward(1);  // d = 1: W(1) - delta = (1.5, 1)
  EXPECT_EQ(a, (std::vector<float>{1.5f, 1.0f}));
  update(2.0f, 0.0f);  // applied to W(1): W(2) = (4, 0); delta = (0.25 + 1, -0.5 + 0) = (1.25, -0.5)
  EXPECT_EQ(a, (std::vector<float>{4.0f, 0.0f}));
  EXPECT_EQ(v.delta()[0], 1.25f);
  EXPECT_EQ(v.delta()[1], -0.5f);
  // next step: F0 F1 B0 (d 0) U B1 (d 1): W(3) - delta(3)
  v.before_forward();
  v.before_micro_forward(0);
  v.before_micro_forward(1);
  v.before_micro_backward(0);
  EXPECT_EQ(a, (std::vector<float>{4.0f, 0.0f}));
  update(0.0f, 4.0f);  // W(3) = (4, 4); delta = (0.625, -0.25 + 2) = (0.625, 1.75)
  v.before_micro_backward(1);
  EXPECT_EQ(a, (std::vector<float>{4.0f - 0.625f, 4.0f - 1.75f}));
  update(0.0f, 0.0f);
  EXPECT_EQ(a, (std::vector<float>{4.0f, 4.0f}));
}
