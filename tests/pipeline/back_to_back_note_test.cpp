// The log line of train/back_to_back.h: for zb-h2 at --pp > 1 with --grad-clip > 0 it names what the first
// stage's update waits for (the global norm); without clipping (the back-to-back executor), other schedules and
// --pp 1 get none.
#include <gtest/gtest.h>

#include <string>

#include "train/back_to_back.h"
#include "train/train_config.h"

namespace {

using mt::train::back_to_back_note;
using mt::train::TrainConfig;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(BackToBackNote, ZbH2NamesWhatTheUpdateWaitsFor) {
  TrainConfig c;
  c.pp = 2;
  c.schedule = "zb-h2";
  c.grad_clip = 0.5;
  const std::string clipped = back_to_back_note(c);
  EXPECT_TRUE(has(clipped, "the global gradient norm (--grad-clip 0.5)")) << clipped;
  EXPECT_TRUE(has(clipped, "(p-1)F + m(F+B+W)")) << clipped;
  EXPECT_TRUE(has(clipped, "with --grad-clip 0 the steps run back to back")) << clipped;
  c.grad_clip = 0;
  EXPECT_EQ(back_to_back_note(c), "");
}

TEST(BackToBackNote, NoneForOtherSchedulesOrOneStage) {
  TrainConfig c;
  c.pp = 2;
  for (const char* name : {"1f1b", "zb-h1", "zb-v", "pipedream-2bw"}) {
    c.schedule = name;
    EXPECT_EQ(back_to_back_note(c), "") << name;
  }
  c.schedule = "zb-h2";
  c.pp = 1;
  EXPECT_EQ(back_to_back_note(c), "");
}

}  // namespace
