// train/elastic.h plan_restart: when a failed job is restarted, with how many ranks, from where, and when not.
#include "train/elastic.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

TrainConfig config(int nproc, const std::string& ckpt_dir) {
  TrainConfig c;
  c.data = "unused.bin";  // validate checks only that it is given
  c.batch_size = 8;
  c.nproc = nproc;
  c.checkpoint_dir = ckpt_dir;
  c.max_restarts = 2;
  return c;
}

comm::LaunchResult failed(std::vector<int> lost = {}, int code = 1) {
  comm::LaunchResult r;
  r.exit_code = code;
  r.failed_rank = 1;
  r.lost_ranks = std::move(lost);
  return r;
}

std::string empty_dir(const std::string& name) {
  const std::string d = testing::TempDir() + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(PlanRestart, SameRanksFromTheStartWhenNoCheckpointIsComplete) {
  const std::string d = empty_dir("elastic_none");
  fs::create_directories(d + "/step_00000002.tmp.1");  // a half-written one does not count
  const RestartPlan p = plan_restart(config(4, d), failed(), 0);
  ASSERT_TRUE(p.restart) << p.message;
  EXPECT_EQ(p.next.nproc, 4);
  EXPECT_TRUE(p.next.resume.empty());
  EXPECT_TRUE(p.next.overwrite_checkpoints);  // what is in the directory, the failed attempt wrote
  EXPECT_EQ(p.message, "restart 1 of 2: from the start (no complete checkpoint yet) with 4 rank(s)");
}

TEST(PlanRestart, AResumedRunWithoutANewCheckpointResumesWhereItStarted) {
  TrainConfig c = config(2, empty_dir("elastic_resumed"));
  c.resume = "/elsewhere";
  const RestartPlan p = plan_restart(c, failed(), 1);
  ASSERT_TRUE(p.restart);
  EXPECT_EQ(p.next.resume, "/elsewhere");
  EXPECT_FALSE(p.next.overwrite_checkpoints);
  EXPECT_EQ(p.message.substr(0, 16), "restart 2 of 2: ");
}

TEST(PlanRestart, LostRanksGiveTheMostRanksTheFlagsAccept) {
  TrainConfig c = config(4, empty_dir("elastic_lost"));
  c.min_nproc = 1;
  c.dp = 4;  // given explicitly: the restart derives it again from the ranks left
  RestartPlan p = plan_restart(c, failed({3}), 0);
  ASSERT_TRUE(p.restart) << p.message;
  EXPECT_EQ(p.next.nproc, 2) << "3 ranks do not divide --batch-size 8";
  EXPECT_EQ(p.next.dp, 0);
  EXPECT_EQ(p.message, "restart 1 of 2: from the start (no complete checkpoint yet) with 2 rank(s) (the place of "
                       "rank(s) 3 is lost; 3 left, 2 used)");
  c.batch_size = 6;  // now 3 divide it
  EXPECT_EQ(plan_restart(c, failed({0}), 0).next.nproc, 3);
  EXPECT_EQ(plan_restart(c, failed({0, 2}), 0).next.nproc, 2);
}

TEST(PlanRestart, WhenNotToRestart) {
  TrainConfig c = config(4, empty_dir("elastic_not"));
  RestartPlan p = plan_restart(c, failed({3}), 0);
  EXPECT_FALSE(p.restart);
  EXPECT_EQ(p.message, "the place of rank(s) 3 is lost and --min-nproc is not given: not restarted with fewer ranks");
  c.min_nproc = 3;
  p = plan_restart(c, failed({3}), 0);  // 3 left, but 3 do not divide the batch, and 2 is below --min-nproc
  EXPECT_FALSE(p.restart);
  EXPECT_NE(p.message.find("no number of ranks from 3 down to --min-nproc 3 fits the flags"), std::string::npos)
      << p.message;
  p = plan_restart(c, failed(), 2);
  EXPECT_FALSE(p.restart);
  EXPECT_EQ(p.message, "giving up after 2 restart(s) (--max-restarts 2)");
  EXPECT_FALSE(plan_restart(c, failed({}, 130), 0).restart);  // Ctrl-C
  EXPECT_FALSE(plan_restart(c, failed({}, 0), 0).restart);    // success
  c.max_restarts = 0;
  p = plan_restart(c, failed(), 0);
  EXPECT_FALSE(p.restart);
  EXPECT_TRUE(p.message.empty());
  // Without --max-restarts an interruption (a closed pipe: 128 + SIGPIPE) says nothing more either: the job's
  // one headline stays the only message.
  p = plan_restart(c, failed({}, 141), 0);
  EXPECT_FALSE(p.restart);
  EXPECT_TRUE(p.message.empty()) << p.message;
}

}  // namespace
}  // namespace mt::train
