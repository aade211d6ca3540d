// Fuzz-style sweep of the CLI's numeric flags (issue 13): for every flag that takes a number, each of the
// values 0, -1, nan, inf, 1e30 and a non-number (for sample, simulate and the benchmarks also values past 2^63
// and with unit suffixes, issue 22) must either be rejected -- exit status 1 and a message that
// names the flag -- or run to completion (exit 0). A crash, a hang, another exit status, or a rejection
// that does not say which flag is at fault fails. Runs are tiny (2 layers x 32 wide, 2 steps) and go three
// at a time.
#include <atomic>
#include <mutex>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

const std::vector<std::string> kValues = {"0", "-1", "nan", "inf", "1e30", "abc"};
// Past 2^63 (and just past int64 below), with unit suffixes, and sizes that overflow once multiplied (issue 22).
const std::vector<std::string> kExtremeValues = {
    "99999999999999999999999", "9223372036854775808", "-9223372036854775809", "1K", "17179869184G", "1e12"};

struct Case {
  std::string flag, value;
  std::vector<std::string> args;
};

// `base` with `flag value` set (replacing the flag's value in base if it is there).
std::vector<std::string> with_flag(std::vector<std::string> base, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < base.size(); i++) {
    if (base[i] == flag) {
      base[i + 1] = value;
      return base;
    }
  }
  base.push_back(flag);
  base.push_back(value);
  return base;
}

// Runs every case, `parallel` at a time, and reports each one that neither ran nor was rejected properly.
// The base command must run by itself first, or every rejection would be for another reason.
void sweep(const std::vector<std::string>& base, const std::vector<Case>& cases, int parallel = 3) {
  RunResult control = run_meshtrain(base, 120);
  ASSERT_EQ(control.exit_code, 0) << "the sweep's base command fails by itself\n" << control.describe();
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures, log(cases.size());
  int accepted = 0, rejected = 0;
  auto worker = [&] {
    for (size_t i; (i = next++) < cases.size();) {
      const Case& c = cases[i];
      RunResult r = run_meshtrain(c.args, 120);
      std::string why;
      if (r.timed_out || r.term_signal != 0)
        why = "crashed or hung";
      else if (r.exit_code == 1 && !contains(r.err, c.flag))
        why = "rejected without naming the flag";
      else if (r.exit_code != 0 && r.exit_code != 1)
        why = "exit status " + std::to_string(r.exit_code);
      std::lock_guard<std::mutex> l(mu);
      (r.exit_code == 0 ? accepted : rejected)++;
      log[i] = c.flag + " " + c.value + " -> " +
               (r.exit_code == 0 ? std::string("ran") : "exit " + std::to_string(r.exit_code) + ": " +
                                                            r.err.substr(0, r.err.find('\n')));
      if (!why.empty()) failures.push_back(c.flag + " " + c.value + ": " + why + "\n" + r.describe());
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < parallel; t++) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_GT(rejected, 0);  // the sweep did probe something
  for (const std::string& line : log) std::printf("  %s\n", line.c_str());
  std::printf("%zu cases: %d ran, %d rejected naming the flag\n", cases.size(), accepted, rejected);
}

std::vector<Case> cases_for(const std::vector<std::string>& base, const std::vector<std::string>& flags,
                            bool extreme = false) {
  std::vector<Case> out;
  for (const std::string& f : flags) {
    for (const std::string& v : kValues) out.push_back({f, v, with_flag(base, f, v)});
    if (extreme)
      for (const std::string& v : kExtremeValues) out.push_back({f, v, with_flag(base, f, v)});
  }
  return out;
}

TEST(FlagSweep, TrainGpt) {
  TempDir dir;
  const std::string shard = dir / "d.bin";
  make_random_shard(shard, 5000, 64, 1);
  const std::vector<std::string> base = concat(
      {"train", "--data", shard, "--seq-len", "16", "--batch-size", "4", "--steps", "2", "--quiet"}, tiny_gpt_flags());
  sweep(base, cases_for(base, {"--n-layer",       "--n-head",           "--n-embd",        "--vocab-size",
                         "--n-positions",   "--batch-size",       "--seq-len",       "--micro-batch-size",
                         "--steps",         "--lr",               "--min-lr",        "--warmup-steps",
                         "--beta1",         "--beta2",            "--eps",           "--weight-decay",
                         "--momentum",      "--grad-clip",        "--seed",          "--threads",
                         "--save-every",    "--keep-checkpoints", "--stop-at-step",  "--divergence-factor",
                         "--divergence-window", "--eval-every",   "--eval-batches",  "--log-every",
                         "--nproc",         "--comm-timeout",     "--dp",            "--zero",
                         "--bucket-mb",     "--compress-adaptive-every", "--compress-adaptive-eta",
                         "--local-sgd",     "--local-sgd-warmup", "--servers",       "--staleness",
                         "--tp",            "--pp",               "--virtual-stages", "--consensus-every"}));
}

// Crossbow's model averaging and the adaptive batch, each from a base that runs with it.
TEST(FlagSweep, TrainLearnersAndAdaptiveBatch) {
  TempDir dir;
  const std::string shard = dir / "d.bin";
  make_random_shard(shard, 5000, 64, 1);
  const std::vector<std::string> common =
      concat({"train", "--data", shard, "--seq-len", "16", "--batch-size", "4", "--micro-batch-size", "2", "--steps",
              "2", "--quiet"},
             tiny_gpt_flags());
  sweep(concat(common, {"--learners", "2"}),
        cases_for(concat(common, {"--learners", "2"}), {"--learners", "--sma-alpha", "--sma-momentum"}));
  const std::vector<std::string> grow = concat(common, {"--adaptive-batch", "--grad-clip", "0"});
  sweep(grow, cases_for(grow, {"--adaptive-batch-max", "--adaptive-batch-every"}));
}

// Byte sizes (K/M/G suffixes): the memory budget and the offload tier's tile, with an offload directory given.
TEST(FlagSweep, TrainByteSizes) {
  TempDir dir;
  const std::string shard = dir / "d.bin";
  make_random_shard(shard, 5000, 64, 1);
  std::filesystem::create_directories(dir / "offload");
  const std::vector<std::string> base =
      concat({"train", "--data", shard, "--seq-len", "16", "--batch-size", "4", "--steps", "2", "--quiet",
              "--offload", "optimizer", "--offload-dir", dir / "offload", "--offload-tile", "8K", "--memory-limit", "2G"},
             tiny_gpt_flags());
  sweep(base, cases_for(base, {"--memory-limit", "--offload-tile"}, true));
}

TEST(FlagSweep, TrainMlp) {
  TempDir dir;
  IdxImages im;
  im.count = 40;
  im.rows = 4;
  im.cols = 4;
  im.pixels.assign(40 * 16, 9);
  write_idx_images(dir / "img", im);
  IdxLabels lb;
  lb.labels.assign(40, 1);
  write_idx_labels(dir / "lab", lb);
  const std::vector<std::string> base = {"train", "--model", "mlp", "--data", dir / "img", "--labels", dir / "lab",
                                         "--hidden", "8", "--batch-size", "4", "--steps", "2", "--quiet",
                                         "--eval-every", "2"};
  sweep(base, cases_for(base, {"--hidden", "--val-fraction", "--batch-size", "--lr", "--eval-every"}));
}

TEST(FlagSweep, Sample) {
  TempDir dir;
  const std::string init = dir / "init.safetensors";
  write_gpt_init(init, GptShape{});
  const std::vector<std::string> base = {"sample", "--init", init, "--max-new-tokens", "4"};
  sweep(base, cases_for(base,
                        {"--max-new-tokens", "--temperature", "--top-k", "--seed", "--n-layer", "--n-head", "--n-embd",
                         "--vocab-size", "--n-positions", "--threads"},
                        true));
}

TEST(FlagSweep, Simulate) {
  const std::vector<std::string> base = {"simulate", "--schedule", "1f1b", "--stages", "4", "--micro-batches", "8"};
  sweep(base,
        cases_for(base, {"--stages", "--micro-batches", "--virtual-stages", "--backward-ratio", "--comm-cost",
                         "--weight-share"},
                  true));
}

TEST(FlagSweep, BenchComm) {
  const std::vector<std::string> base = {
      "bench",       "comm", "--no-mpi-peer",      "--nproc", "2", "--ops", "all_reduce", "--min-bytes", "4K",
      "--max-bytes", "8K",   "--seconds-per-size", "0.01"};
  sweep(base,
        cases_for(base, {"--nproc", "--min-bytes", "--max-bytes", "--seconds-per-size", "--rounds", "--comm-timeout"},
                  true),
        2);
}

TEST(FlagSweep, BenchPipeline) {
  const std::vector<std::string> base = {"bench",           "pipeline", "--stages",     "2", "--schedules",     "1f1b",
                                         "--micro-batches", "2",        "--forward-ms", "1", "--activation-kb", "4",
                                         "--steps",         "2"};
  sweep(base,
        cases_for(base,
                  {"--stages", "--micro-batches", "--virtual-stages", "--forward-ms", "--backward-ratio",
                   "--weight-share", "--activation-kb", "--steps", "--comm-timeout"},
                  true),
        2);
}

TEST(FlagSweep, BenchTrain) {
  const std::vector<std::string> base = {"bench", "train", "--no-torch", "--steps", "1", "--warmup", "0",
                                         "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--vocab-size", "64",
                                         "--seq-len", "8", "--batch-size", "2"};
  sweep(base, cases_for(base, {"--threads", "--steps", "--warmup", "--batch-size", "--seq-len", "--n-layer", "--n-head",
                         "--n-embd", "--vocab-size"}, true));
}

}  // namespace
}  // namespace mt::clitest
