// Cadence (train/observers.h): after which steps a run evaluates, saves and stops, from the flags, for
// every loop. Steps are 0-based; "after s" is after the update of step s.
#include <gtest/gtest.h>

#include <vector>

#include "train/observers.h"
#include "train/train_config.h"

namespace {

using mt::train::Cadence;

// The steps s < limit for which pred(s) holds.
template <class P>
std::vector<int64_t> steps_where(int64_t limit, P pred) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < limit; s++)
    if (pred(s)) out.push_back(s);
  return out;
}

mt::train::TrainConfig flags(int64_t steps, int64_t eval_every, int64_t save_every, int64_t stop_at, bool dir) {
  mt::train::TrainConfig c;
  c.steps = steps;
  c.eval_every = eval_every;
  c.save_every = save_every;
  c.stop_at_step = stop_at;
  if (dir) c.checkpoint_dir = "ckpt";
  return c;
}

TEST(Cadence, EvalEveryKAndAtTheEnd) {
  const Cadence c = Cadence::from(flags(10, 4, 0, 0, false), true);
  EXPECT_EQ(steps_where(10, [&](int64_t s) { return c.eval_after(s); }), (std::vector<int64_t>{3, 7, 9}));
  EXPECT_TRUE(steps_where(10, [&](int64_t s) { return c.save_after(s); }).empty());  // no --checkpoint-dir
  EXPECT_EQ(c.end(), 10);
  // No held-out data, or --eval-every 0: never.
  const Cadence none = Cadence::from(flags(10, 4, 0, 0, false), false);
  EXPECT_TRUE(steps_where(10, [&](int64_t s) { return none.eval_after(s); }).empty());
  const Cadence zero = Cadence::from(flags(10, 0, 0, 0, false), true);
  EXPECT_TRUE(steps_where(10, [&](int64_t s) { return zero.eval_after(s); }).empty());
}

TEST(Cadence, SaveEveryKAtTheEndAndAtTheStop) {
  const Cadence c = Cadence::from(flags(10, 0, 3, 0, true), false);
  EXPECT_EQ(steps_where(10, [&](int64_t s) { return c.save_after(s); }), (std::vector<int64_t>{2, 5, 8, 9}));
  // --checkpoint-dir alone: one checkpoint, at the end.
  const Cadence end_only = Cadence::from(flags(10, 0, 0, 0, true), false);
  EXPECT_EQ(steps_where(10, [&](int64_t s) { return end_only.save_after(s); }), (std::vector<int64_t>{9}));
  // --stop-at-step 5: the run ends after step 4 and saves there to be resumed.
  const Cadence stop = Cadence::from(flags(10, 0, 3, 5, true), false);
  EXPECT_EQ(stop.end(), 5);
  EXPECT_EQ(steps_where(10, [&](int64_t s) { return stop.stop_after(s); }), (std::vector<int64_t>{4}));
  EXPECT_EQ(steps_where(stop.end(), [&](int64_t s) { return stop.save_after(s); }), (std::vector<int64_t>{2, 4}));
  // A stop beyond --steps ends at --steps.
  EXPECT_EQ(Cadence::from(flags(10, 0, 0, 50, true), false).end(), 10);
}

}  // namespace
