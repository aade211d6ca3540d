// Non-finite loss: a run with an absurd learning rate must stop with an error that says at which step and
// what went non-finite, and the "last good checkpoint" it names must be complete, from before the failing
// step, and usable to continue with a sane learning rate.
//
// AdamW's update is bounded by lr per element, so on the tiny model it only diverges at lr >= ~2e8 (and at
// >= 1e9 already at step 1, before any checkpoint); SGD with momentum diverges from lr ~3 on. The tests use
// SGD with the brief's lr 1e4 and a moderate 100 (different failing steps relative to --save-every 2).
#include <cmath>
#include <regex>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

// --divergence-factor 0: these runs test the non-finite path; the finite blow-up guard, which would stop some
// of them a few steps earlier, has its own tests (tests/cli/hardening_test.cpp, tests/unit).
std::vector<std::string> tiny_run(const std::string& data) {
  return concat({"train", "--data", data, "--seq-len", "16", "--batch-size", "4", "--quiet", "--divergence-factor", "0"},
                tiny_gpt_flags());
}

struct Divergence {
  int64_t failing_step = -1;
  std::string checkpoint;  // "" when the message says none was written
  std::string stderr_text;
};

// Runs the diverging training and checks the error itself; returns what the message says.
Divergence run_diverging(const std::string& shard, const std::string& ckpt_dir, const std::string& metrics,
                         const std::string& optimizer, const std::string& lr, int save_every = 2) {
  RunResult r = run_meshtrain(concat(
      tiny_run(shard), {"--steps", "20", "--optimizer", optimizer, "--lr", lr, "--grad-clip", "0", "--save-every",
                        std::to_string(save_every), "--checkpoint-dir", ckpt_dir, "--metrics", metrics}));
  Divergence d;
  d.stderr_text = r.err;
  EXPECT_EQ(r.term_signal, 0) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << "expected the run to diverge\n" << r.describe();
  std::smatch m;
  std::regex step_re(R"((loss|gradient norm) is \S+ at step (\d+))");
  if (!std::regex_search(r.err, m, step_re)) {
    ADD_FAILURE() << "no \"<loss|gradient norm> is X at step N\" in stderr\n" << r.describe();
    return d;
  }
  // The message numbers steps as the progress line does (from 1); failing_step is the 0-based index.
  d.failing_step = std::stoll(m[2].str()) - 1;
  std::regex ckpt_re(R"(last good checkpoint is (\S+?)[ ,.;]*(\(|$))");
  if (std::regex_search(r.err, m, ckpt_re)) d.checkpoint = m[1].str();
  // Metrics: one row per completed step, none for the failing one, all finite.
  std::vector<std::string> rows = read_lines(metrics);
  EXPECT_EQ((int64_t)rows.size(), d.failing_step) << r.describe();
  for (const std::string& row : rows) {
    auto j = nlohmann::json::parse(row);
    EXPECT_TRUE(j["loss"].is_number() && std::isfinite(j["loss"].get<double>())) << row;
  }
  return d;
}

// The named checkpoint is complete, before the failing step, what `latest` names, holds finite weights and
// continues with a sane learning rate.
void check_last_good_checkpoint(const std::string& shard, const std::string& ckpt_dir, const Divergence& d,
                                const std::string& optimizer, const TempDir& dir) {
  SCOPED_TRACE("stderr of the diverging run: " + d.stderr_text);
  ASSERT_FALSE(d.checkpoint.empty()) << "the message names no checkpoint";
  fs::path ck(d.checkpoint);  // absolute: the test passes an absolute --checkpoint-dir
  ASSERT_TRUE(fs::exists(ck)) << ck;
  ASSERT_TRUE(is_complete_checkpoint(ck));
  EXPECT_EQ(trim(slurp(ckpt_dir + "/latest")), ck.filename().string());

  auto st = nlohmann::json::parse(slurp((ck / "state.json").string()));
  int64_t step = st["step"].get<int64_t>();
  EXPECT_LT(step, d.failing_step) << "the \"last good\" checkpoint " << ck << " resumes at step " << step
                                  << ", i.e. holds exactly the weights whose loss/gradient at step " << d.failing_step
                                  << " was not finite";
  size_t nonfinite = 0, total = 0;
  float max_abs = 0;
  for (auto& [name, v] : read_all_f32((ck / "model.safetensors").string())) {
    for (float x : v) {
      total++;
      if (!std::isfinite(x))
        nonfinite++;
      else
        max_abs = std::max(max_abs, std::fabs(x));
    }
  }
  EXPECT_GT(total, 0u);
  EXPECT_EQ(nonfinite, 0u) << ck << " holds non-finite weights";

  // Continue from it with a sane learning rate for two steps beyond the failing one.
  std::string metrics = dir / "resumed.jsonl";
  RunResult r =
      run_meshtrain(concat(tiny_run(shard), {"--steps", std::to_string(d.failing_step + 2), "--optimizer", optimizer,
                                             "--lr", "1e-3", "--grad-clip", "1", "--resume", ck.string(), "--metrics",
                                             metrics, "--save", dir / "resumed.safetensors"}));
  EXPECT_EQ(r.exit_code, 0) << "resuming from the last good checkpoint " << ck << " (max |w| = " << max_abs
                            << ") with --lr 1e-3 failed\n"
                            << r.describe();
}

TEST(Divergence, HugeLrSgdStopsWithStepAndUsableCheckpoint) {
  TempDir dir;
  std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 1);
  Divergence d = run_diverging(shard, ckpt, dir / "m.jsonl", "sgd", "1e4");
  ASSERT_GT(d.failing_step, 0);
  check_last_good_checkpoint(shard, ckpt, d, "sgd", dir);
}

TEST(Divergence, ModerateLrSgdStopsWithStepAndUsableCheckpoint) {
  TempDir dir;
  std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 1);
  Divergence d = run_diverging(shard, ckpt, dir / "m.jsonl", "sgd", "100");
  ASSERT_GT(d.failing_step, 0);
  check_last_good_checkpoint(shard, ckpt, d, "sgd", dir);
}

// With a checkpoint after every step, the failing step s always has a checkpoint step_s on disk, saved
// after the update of step s-1 -- i.e. the very weights whose loss at step s is not finite. The checkpoint
// the message calls good must be an earlier one.
TEST(Divergence, HugeLrSgdSaveEveryStepNamesACheckpointBeforeTheFailure) {
  TempDir dir;
  std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 1);
  Divergence d = run_diverging(shard, ckpt, dir / "m.jsonl", "sgd", "1e4", /*save_every=*/1);
  ASSERT_GT(d.failing_step, 1);
  check_last_good_checkpoint(shard, ckpt, d, "sgd", dir);
}

TEST(Divergence, AdamWDivergingBeforeAnyCheckpointSaysSo) {
  TempDir dir;
  std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 1);
  std::string metrics = dir / "m.jsonl";
  RunResult r =
      run_meshtrain(concat(tiny_run(shard), {"--steps", "20", "--lr", "1e10", "--grad-clip", "0", "--save-every", "4",
                                             "--checkpoint-dir", ckpt, "--metrics", metrics}));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"((loss|gradient norm) is \S+ at step (\d+))"))) << r.describe();
  int64_t n = std::stoll(m[2].str()) - 1;  // printed from 1, as in the progress line
  ASSERT_LT(n, 3) << "test premise: AdamW at lr 1e10 fails before the first save at step 4\n" << r.describe();
  EXPECT_TRUE(contains(r.err, "No checkpoint was written")) << r.describe();
  EXPECT_FALSE(fs::exists(ckpt + "/latest"));
}

}  // namespace
}  // namespace mt::clitest
