// meshtrain train --config FILE.toml and the resolved configuration every run writes beside its metrics
// (apps/meshtrain/config_file.*): the written file repeats the run exactly (same losses, byte-equal weights),
// alone and with --nproc 2; flags beside --config override it; bad files are errors naming file, line and key.
#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = dir_ / "data.bin";
    make_random_shard(shard_, 5000, 64, 1);
  }
  // A tiny GPT run from flags with non-default values of every TOML type (integer, float, string, bool).
  std::vector<std::string> flags_run(const std::string& out, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> f = {"train", "--data", shard_, "--seq-len", "16", "--batch-size", "4", "--steps", "4"};
    f = concat(f, {"--lr", "1.23456789e-3", "--warmup-steps", "1", "--grad-clip", "0.5", "--seed", "7"});
    f = concat(f,
               {"--recompute", "--quiet", "--metrics", out + "/metrics.jsonl", "--save", out + "/model.safetensors"});
    return concat(concat(f, tiny_gpt_flags()), extra);
  }
  std::string write(const std::string& name, const std::string& text) {
    write_bytes(dir_ / name, text);
    return dir_ / name;
  }
  TempDir dir_;
  std::string shard_;
};

// The "loss" column of a metrics file, as printed (exact text, so equal means bit-equal).
std::vector<std::string> losses(const std::string& metrics) {
  std::vector<std::string> out;
  for (const std::string& row : read_lines(metrics)) out.push_back(raw_json_number(row, "loss"));
  return out;
}

void expect_error_naming(const RunResult& r, const std::vector<std::string>& words) {
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  for (const std::string& w : words)
    EXPECT_TRUE(contains(r.err, w)) << "stderr lacks \"" << w << "\"\n" << r.describe();
}

// Runs `flags` into a/, then `meshtrain train --config a/metrics.toml` with the outputs moved to b/, and
// compares: same losses, byte-equal weights, and b's written configuration equal to a's but for the outputs.
void expect_config_repeats(const TempDir& dir, const std::vector<std::string>& flags) {
  RunResult a = run_meshtrain(flags, 120);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const std::string written = slurp(dir / "a/metrics.toml");
  ASSERT_TRUE(contains(written, "\nsteps = 4\n")) << written;
  RunResult b = run_meshtrain({"train", "--config", dir / "a/metrics.toml", "--metrics", dir / "b/metrics.jsonl",
                               "--save", dir / "b/model.safetensors"},
                              120);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const std::vector<std::string> la = losses(dir / "a/metrics.jsonl");
  EXPECT_EQ(la.size(), 4u);
  EXPECT_EQ(la, losses(dir / "b/metrics.jsonl"));
  EXPECT_EQ(slurp(dir / "a/model.safetensors"), slurp(dir / "b/model.safetensors"));
  std::string expected = written;
  for (const char* f : {"/metrics.jsonl", "/model.safetensors"}) {
    const size_t at = expected.find(dir / (std::string("a") + f));
    ASSERT_NE(at, std::string::npos) << written;
    expected.replace(at, (dir / (std::string("a") + f)).size(), dir / (std::string("b") + f));
  }
  EXPECT_EQ(slurp(dir / "b/metrics.toml"), expected);
}

TEST_F(ConfigFile, WrittenConfigRepeatsTheRun) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  expect_config_repeats(dir_, flags_run(dir_ / "a"));
  const std::string written = slurp(dir_ / "a/metrics.toml");
  // Every value spelled as the flag's: given ones, defaults (beta2, hidden is MLP-only so absent), unset ones.
  for (const char* line :
       {"\nlr = 0.00123456789\n", "\nseed = 7\n", "\nrecompute = true\n", "\nbeta2 = 0.95\n", "\nmodel = 'gpt'\n",
        "\ncomm-timeout = 300.0\n", "\n# init: not set\n", "\n# resume: not set  (never repeated"})
    EXPECT_TRUE(contains(written, line)) << "lacks " << line << " in\n" << written;
  EXPECT_FALSE(contains(written, "\nhidden")) << written;
}

TEST_F(ConfigFile, WrittenConfigRepeatsADataParallelRun) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  expect_config_repeats(dir_, flags_run(dir_ / "a", {"--nproc", "2", "--zero", "1"}));
  EXPECT_TRUE(contains(slurp(dir_ / "a/metrics.toml"), "\nnproc = 2\n"));
}

// An MLP run: list flags as arrays, and the GPT-only flags (seq-len, with its default) left out, since --model
// mlp refuses them.
TEST_F(ConfigFile, WrittenConfigRepeatsAnMlpRun) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  std::mt19937 gen(3);
  IdxImages images{64, 4, 4, std::vector<uint8_t>(64 * 16)};
  IdxLabels labels;
  for (uint8_t& p : images.pixels) p = (uint8_t)(gen() % 256);
  for (int i = 0; i < 64; i++) labels.labels.push_back((uint8_t)(gen() % 10));
  write_idx_images(dir_ / "img.idx", images);
  write_idx_labels(dir_ / "lab.idx", labels);
  expect_config_repeats(dir_, {"train",
                               "--model",
                               "mlp",
                               "--data",
                               dir_ / "img.idx",
                               "--labels",
                               dir_ / "lab.idx",
                               "--hidden",
                               "16,8",
                               "--steps",
                               "4",
                               "--batch-size",
                               "8",
                               "--lr",
                               "0.05",
                               "--quiet",
                               "--metrics",
                               dir_ / "a/metrics.jsonl",
                               "--save",
                               dir_ / "a/model.safetensors"});
  const std::string written = slurp(dir_ / "a/metrics.toml");
  EXPECT_TRUE(contains(written, "\nhidden = [16, 8]\n")) << written;
  EXPECT_FALSE(contains(written, "seq-len")) << written;
}

// Beside --metrics; beside --save when --metrics is absent or a device; Hogwild runs write it too.
TEST_F(ConfigFile, WhereTheFileGoes) {
  auto run = [&](const std::vector<std::string>& outputs) {
    std::vector<std::string> f = flags_run(dir_.path());
    for (const char* flag : {"--metrics", "--save"}) {  // flags_run's own outputs replaced by `outputs`
      auto at = std::find(f.begin(), f.end(), flag);
      f.erase(at, at + 2);
    }
    RunResult r = run_meshtrain(concat(f, outputs), 60);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
  };
  run({"--metrics", "/dev/null", "--save", dir_ / "w1.safetensors"});
  EXPECT_TRUE(contains(slurp(dir_ / "w1.toml"), "\nmetrics = '/dev/null'\n"));
  run({"--metrics", dir_ / "run.jsonl", "--save", dir_ / "w2.safetensors"});
  EXPECT_TRUE(fs::exists(dir_ / "run.toml"));
  EXPECT_FALSE(fs::exists(dir_ / "w2.toml"));
  std::vector<std::string> hogwild = {"train", "--model",     "mlp", "--async",  "hogwild", "--nproc",
                                      "2",     "--optimizer", "sgd", "--hidden", "8",       "--batch-size",
                                      "8",     "--steps",     "2",   "--quiet"};
  IdxImages images{32, 4, 4, std::vector<uint8_t>(32 * 16, 7)};
  IdxLabels labels{std::vector<uint8_t>(32, 1)};
  write_idx_images(dir_ / "img.idx", images);
  write_idx_labels(dir_ / "lab.idx", labels);
  RunResult r = run_meshtrain(
      concat(hogwild, {"--data", dir_ / "img.idx", "--labels", dir_ / "lab.idx", "--metrics", dir_ / "hog.jsonl"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(slurp(dir_ / "hog.toml"), "\nasync = 'hogwild'\n"));
}

// --config of a run's own file with nothing beside it: the same outputs again, bit for bit (the file is
// rewritten with the same text).
TEST_F(ConfigFile, RepeatingInPlaceGivesTheSameOutputs) {
  fs::create_directories(dir_ / "a");
  RunResult a = run_meshtrain(flags_run(dir_ / "a"), 120);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const std::string weights = slurp(dir_ / "a/model.safetensors"), config = slurp(dir_ / "a/metrics.toml");
  const std::vector<std::string> la = losses(dir_ / "a/metrics.jsonl");
  fs::remove(dir_ / "a/model.safetensors");
  RunResult b = run_meshtrain({"train", "--config", dir_ / "a/metrics.toml"}, 120);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  EXPECT_EQ(losses(dir_ / "a/metrics.jsonl"), la);
  EXPECT_EQ(slurp(dir_ / "a/model.safetensors"), weights);
  EXPECT_EQ(slurp(dir_ / "a/metrics.toml"), config);
}

TEST_F(ConfigFile, FlagsOverrideTheFile) {
  const std::string cfg =
      write("run.toml", "data = \"" + shard_ +
                            "\"\nsteps = 5\nbatch_size = 2\nseq-len = 16\nlr = 0.01\n"
                            "n-layer = 1\nn-head = 2\nn-embd = 16\nvocab-size = 64\nquiet = true\n");
  RunResult r = run_meshtrain({"train", "--config", cfg, "--steps", "2", "--metrics", dir_ / "m.jsonl"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(read_lines(dir_ / "m.jsonl").size(), 2u);  // --steps 2 beat steps = 5
  const std::string written = slurp(dir_ / "m.toml");
  for (const char* line : {"\nsteps = 2\n", "\nbatch-size = 2\n", "\nlr = 0.01\n", "\nn-layer = 1\n"})
    EXPECT_TRUE(contains(written, line)) << "lacks " << line << " in\n" << written;
}

TEST_F(ConfigFile, SyntaxErrorNamesFileLineAndKey) {
  const std::string cfg = write("bad.toml", "steps = 2\n\nbatch-size = 8x\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg}), {cfg + ":3:", "batch-size", "syntax error"});
}

TEST_F(ConfigFile, UnknownKeyNamesFileLineAndKey) {
  const std::string cfg = write("bad.toml", "steps = 2\nbatchsize = 4\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg}),
                      {cfg + ":2: key 'batchsize'", "unknown key", "did you mean 'batch-size'"});
}

TEST_F(ConfigFile, WrongTypeNamesFileLineAndKey) {
  const std::string cfg = write("bad.toml", "# a comment\nlr = 0.1\nsteps = \"4\"\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg}),
                      {cfg + ":3: key 'steps'", "wrong type", "takes an integer, got a string"});
  const std::string cfg2 = write("bad2.toml", "recompute = 1\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg2}),
                      {cfg2 + ":1: key 'recompute'", "takes true or false, got an integer"});
  const std::string cfg3 = write("bad3.toml", "stage-layers = [1, \"2\"]\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg3}),
                      {cfg3 + ":1: key 'stage-layers'", "got an array holding a string"});
}

// A value of the right type that the flag refuses: the flag's own message, with the file's line.
TEST_F(ConfigFile, RefusedValueNamesFileLineAndKey) {
  const std::string cfg = write("bad.toml", "steps = 2\nn-layer = 0\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg}), {cfg + ":2: key 'n-layer'", "--n-layer"});
  const std::string cfg2 = write("bad2.toml", "\nmodel = \"gptx\"\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg2}),
                      {cfg2 + ":2: key 'model'", "--model must be one of gpt, mlp"});
  const std::string cfg3 = write("bad3.toml", "model = \"mlp\"\nseq-len = 16\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg3}), {cfg3 + ":2: key 'seq-len'", "--model mlp"});
}

TEST_F(ConfigFile, TablesAndDuplicatesAreRefused) {
  const std::string cfg = write("bad.toml", "steps = 2\n[train]\nlr = 0.1\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg}), {cfg + ":2: key 'train'", "tables"});
  const std::string cfg2 = write("bad2.toml", "batch-size = 2\nbatch_size = 4\n");
  expect_error_naming(run_meshtrain({"train", "--config", cfg2}),
                      {cfg2 + ":2: key 'batch_size'", "already set on line 1"});
}

// A hand-written file is never replaced by the resolved configuration of a run that differs from it.
TEST_F(ConfigFile, TheConfigFileIsNotReplaced) {
  const std::string text = "data = \"" + shard_ + "\"\nsteps = 2\nmetrics = \"" + (dir_ / "run.jsonl") + "\"\n";
  const std::string cfg = write("run.toml", text);
  expect_error_naming(run_meshtrain({"train", "--config", cfg, "--steps", "3"}), {"which is the --config file"});
  EXPECT_EQ(slurp(cfg), text);
  EXPECT_FALSE(fs::exists(dir_ / "run.jsonl"));
}

}  // namespace
}  // namespace mt::clitest
