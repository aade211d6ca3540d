// Checkpoint atomicity: SIGKILL a run that writes a checkpoint after every step (so a kill lands in a save
// often) and check that `latest` still names a complete checkpoint that --resume accepts. Three kill cycles at
// different delays, each resuming from what the previous one left; the assertions hold whatever the kill
// interrupted, so the test is not timing-sensitive (only its coverage is).
#include <algorithm>
#include <regex>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

// Complete lines in a file that is being appended to.
size_t complete_lines(const std::string& path) {
  std::string s = slurp(path);
  return (size_t)std::count(s.begin(), s.end(), '\n');
}

// latest names a complete, non-temporary checkpoint; returns its step (-1 on failure).
int64_t check_latest(const std::string& ckpt) {
  const std::string latest_path = ckpt + "/latest";
  if (!fs::exists(latest_path)) {
    ADD_FAILURE() << "no " << latest_path << " after the kill";
    return -1;
  }
  std::string name = trim(slurp(latest_path));
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(step_\d{8})"))) << "latest = '" << name << "'";
  EXPECT_EQ(name.find(".tmp."), std::string::npos) << "latest names a temporary directory: " << name;
  ::testing::AssertionResult complete = is_complete_checkpoint(fs::path(ckpt) / name);
  EXPECT_TRUE(complete);
  if (!complete) return -1;
  return nlohmann::json::parse(slurp(ckpt + "/" + name + "/state.json"))["step"].get<int64_t>();
}

TEST(CheckpointAtomicity, SigkillDuringSavesLeavesLatestUsable) {
  TempDir dir;
  const std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 20000, 256, 5);
  // ~0.8M parameters: 3 MB of weights, 6 MB of AdamW state per checkpoint.
  const std::vector<std::string> common = {
      meshtrain_bin(),      "train", "--data",           shard,    "--n-layer",     "4",    "--n-head",     "4",
      "--n-embd",           "128",   "--vocab-size",     "256",    "--n-positions", "64",   "--seq-len",    "32",
      "--batch-size",       "4",     "--steps",          "100000", "--lr",          "1e-3", "--save-every", "1",
      "--keep-checkpoints", "2",     "--checkpoint-dir", ckpt,     "--quiet"};

  const int delays_ms[] = {0, 23, 57};
  int64_t last_step = -1;
  for (int cycle = 0; cycle < 3; cycle++) {
    SCOPED_TRACE("kill cycle " + std::to_string(cycle));
    const std::string metrics = dir / ("m" + std::to_string(cycle) + ".jsonl");
    std::vector<std::string> argv = concat(common, {"--metrics", metrics});
    if (cycle > 0) argv = concat(argv, {"--resume", ckpt});
    BackgroundProcess p(argv, dir / "out.txt", dir / ("err" + std::to_string(cycle) + ".txt"));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    bool ready = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (p.exited()) break;
      if (complete_lines(metrics) >= 3) {
        ready = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(ready) << "the run did not write 3 metrics rows in time (exited: " << p.exited() << ")\n"
                       << slurp(dir / ("err" + std::to_string(cycle) + ".txt"));
    std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[cycle]));
    p.kill_now();
    int status = p.wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

    // The resumed process (cycles > 0) started where latest pointed.
    if (cycle > 0) {
      auto first = nlohmann::json::parse(read_lines(metrics).front());
      EXPECT_EQ(first["step"].get<int64_t>(), last_step) << "a resumed run should continue at latest's step";
    }
    int64_t step = check_latest(ckpt);
    ASSERT_GE(step, 1);
    EXPECT_GE(step, last_step) << "latest went backwards";
    last_step = step;
    for (auto& e : fs::directory_iterator(ckpt)) {
      std::string n = e.path().filename().string();
      if (n.find(".tmp.") != std::string::npos) continue;  // allowed, as long as latest does not name it
      EXPECT_TRUE(n == "latest" || n.rfind("step_", 0) == 0) << "unexpected entry " << e.path();
    }
  }

  // Finally resume in the foreground for two more steps; it must succeed and move latest on.
  const std::string metrics = dir / "final.jsonl";
  std::vector<std::string> args(common.begin() + 1, common.end());
  for (size_t i = 0; i + 1 < args.size(); i++)
    if (args[i] == "--steps") args[i + 1] = std::to_string(last_step + 2);
  RunResult r = run_meshtrain(concat(args, {"--resume", ckpt, "--metrics", metrics}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<std::string> rows = read_lines(metrics);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(rows[0])["step"].get<int64_t>(), last_step);
  EXPECT_EQ(check_latest(ckpt), last_step + 2);
  // The final, uninterrupted save pruned to --keep-checkpoints 2 (temporaries of killed processes aside).
  int kept = 0;
  for (auto& e : fs::directory_iterator(ckpt)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.find(".tmp.") == std::string::npos) kept++;
  }
  EXPECT_EQ(kept, 2);
}

}  // namespace
}  // namespace mt::clitest
