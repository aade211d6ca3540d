// Bad input to `meshtrain train`: every case must exit with status 1 (an error, not a crash) and print a
// message on stderr that names what is at fault (file, tensor, token, flag) with the offending values.
#include <chrono>
#include <regex>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    good_shard_ = dir_ / "good.bin";
    make_random_shard(good_shard_, 5000, 64, 1);
  }

  // Tiny GPT on `data` plus `extra` flags. CLI11 rejects a repeated flag, so callers that set a shape flag
  // themselves pass with_shape = false (or a complete argument list).
  std::vector<std::string> gpt_args(const std::string& data, const std::vector<std::string>& extra,
                                    bool with_shape = true) {
    std::vector<std::string> a{"train",        "--data", data,      "--seq-len", "16",
                               "--batch-size", "4",      "--steps", "2",         "--quiet"};
    if (with_shape) a = concat(a, tiny_gpt_flags());
    return concat(a, extra);
  }

  // Status 1, no signal, no timeout, and the error line on stderr.
  static void expect_error(const RunResult& r) {
    EXPECT_FALSE(r.timed_out) << r.describe();
    EXPECT_EQ(r.term_signal, 0) << "crashed instead of reporting an error\n" << r.describe();
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_TRUE(contains(r.err, "error")) << r.describe();
  }

  TempDir dir_;
  std::string good_shard_;
};

#define EXPECT_ERR_HAS(r, s) EXPECT_TRUE(contains((r).err, (s))) << "stderr lacks \"" << (s) << "\"\n" << (r).describe()
#define EXPECT_ERR_MATCHES(r, re)                                                                       \
  EXPECT_TRUE(std::regex_search((r).err, std::regex(re))) << "stderr does not match /" << (re) << "/\n" \
                                                          << (r).describe()

TEST_F(BadInput, PositiveControlTinyGptTrains) {
  // The base flags every case below starts from are fine on their own.
  RunResult r = run_meshtrain(gpt_args(good_shard_, {}));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST_F(BadInput, MissingDataFile) {
  std::string missing = dir_ / "no_such_shard.bin";
  RunResult r = run_meshtrain(gpt_args(missing, {}));
  expect_error(r);
  EXPECT_ERR_HAS(r, missing);
}

TEST_F(BadInput, TruncatedTokenShard) {
  std::string p = dir_ / "truncated.bin";
  write_raw_shard(p, kTokenShardMagic, kTokenShardVersion, 1000, 600);  // header promises 1000 tokens, 600 follow
  RunResult r = run_meshtrain(gpt_args(p, {}));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "1000");
  EXPECT_ERR_HAS(r, "1200");  // the bytes that are there
}

TEST_F(BadInput, WrongMagicShowsMagicFound) {
  std::string p = dir_ / "magic.bin";
  write_raw_shard(p, 12345678, kTokenShardVersion, 600, 600);
  RunResult r = run_meshtrain(gpt_args(p, {}));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "magic");
  EXPECT_ERR_HAS(r, "12345678");
  EXPECT_ERR_HAS(r, "20240520");  // and the one expected
}

TEST_F(BadInput, WrongVersion) {
  std::string p = dir_ / "version.bin";
  write_raw_shard(p, kTokenShardMagic, 7, 600, 600);
  RunResult r = run_meshtrain(gpt_args(p, {}));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_MATCHES(r, "version 7");
}

TEST_F(BadInput, InitHeaderDataOffsetsBeyondFile) {
  std::string p = dir_ / "lying.safetensors";
  // 4 floats need 16 bytes; the data buffer holds 8.
  write_raw_safetensors(p, R"({"wte.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 8);
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p, "--n-head", "2"}, false));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "wte.weight");
  EXPECT_ERR_HAS(r, "16");
}

TEST_F(BadInput, InitUnknownDtype) {
  std::string p = dir_ / "dtype.safetensors";
  write_raw_safetensors(p, R"({"wte.weight":{"dtype":"Q7","shape":[2,2],"data_offsets":[0,4]}})", 4);
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p, "--n-head", "2"}, false));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "wte.weight");
  EXPECT_ERR_HAS(r, "Q7");
  EXPECT_ERR_HAS(r, "dtype");
}

TEST_F(BadInput, ValidHandMadeInitTrains) {
  // Positive control for the --init cases: a complete file in Hugging Face names loads and trains.
  std::string p = dir_ / "init.safetensors";
  write_gpt_init(p, GptShape{});
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p}, false));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST_F(BadInput, InitMissingTensor) {
  std::string p = dir_ / "missing.safetensors";
  InitOptions o;
  o.omit = "h.1.mlp.c_fc.weight";
  write_gpt_init(p, GptShape{}, o);
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p}, false));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "h.1.mlp.c_fc.weight");
  EXPECT_ERR_HAS(r, "missing");
}

TEST_F(BadInput, InitMisshapedTensorNamesBothShapes) {
  std::string p = dir_ / "misshaped.safetensors";
  InitOptions o;
  o.reshape = "h.0.attn.c_proj.weight";
  o.new_shape = {32, 16};
  write_gpt_init(p, GptShape{}, o);
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p}, false));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "h.0.attn.c_proj.weight");
  EXPECT_ERR_MATCHES(r, R"(\[32, ?16\])");  // found
  EXPECT_ERR_MATCHES(r, R"(\[32, ?32\])");  // expected
}

TEST_F(BadInput, InitWithoutNHeadNeedsFlag) {
  std::string p = dir_ / "nohead.safetensors";
  InitOptions o;
  o.with_n_head_metadata = false;
  write_gpt_init(p, GptShape{}, o);
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--init", p}, false));
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "n_head");
  EXPECT_ERR_HAS(r, "--n-head");
  // ... and passing the flag is enough.
  RunResult ok = run_meshtrain(gpt_args(good_shard_, {"--init", p, "--n-head", "2"}, false));
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();
}

TEST_F(BadInput, TokenOutsideVocabulary) {
  std::string p = dir_ / "vocab.bin";
  std::vector<uint16_t> toks = random_tokens(2000, 200, 3);
  toks[1234] = 300;
  write_token_shard(p, toks);
  RunResult r = run_meshtrain({"train", "--data",       p,     "--n-layer",     "1",  "--n-head",  "2",  "--n-embd",
                               "16",    "--vocab-size", "256", "--n-positions", "32", "--seq-len", "16", "--batch-size",
                               "2",     "--steps",      "1",   "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_HAS(r, "300");
  EXPECT_ERR_HAS(r, "1234");
  EXPECT_ERR_HAS(r, "256");
}

TEST_F(BadInput, SeqLenBeyondNPositions) {
  RunResult r = run_meshtrain(
      {"train", "--data",        good_shard_, "--n-layer", "2",  "--n-head",     "2", "--n-embd", "32", "--vocab-size",
       "64",    "--n-positions", "32",        "--seq-len", "48", "--batch-size", "2", "--steps",  "1",  "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, "--seq-len");
  EXPECT_ERR_HAS(r, "48");
  EXPECT_ERR_HAS(r, "32");
}

TEST_F(BadInput, BatchTheDataCannotFill) {
  std::string p = dir_ / "small.bin";
  make_random_shard(p, 50, 64, 4);
  RunResult r = run_meshtrain({"train", "--data",       p,    "--n-layer",     "2",  "--n-head",  "2",  "--n-embd",
                               "32",    "--vocab-size", "64", "--n-positions", "32", "--seq-len", "32", "--batch-size",
                               "4",     "--steps",      "1",  "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, p);
  EXPECT_ERR_MATCHES(r, R"(\b50\b)");   // tokens there
  EXPECT_ERR_MATCHES(r, R"(\b129\b)");  // tokens needed: 4 * 32 + 1
}

TEST_F(BadInput, NEmbdNotDivisibleByNHead) {
  RunResult r = run_meshtrain(
      {"train", "--data",        good_shard_, "--n-layer", "1",  "--n-head",     "4", "--n-embd", "30", "--vocab-size",
       "64",    "--n-positions", "32",        "--seq-len", "16", "--batch-size", "2", "--steps",  "1",  "--quiet"});
  expect_error(r);
  EXPECT_ERR_MATCHES(r, "n[_-]embd");
  EXPECT_ERR_MATCHES(r, "n[_-]head");
  EXPECT_ERR_MATCHES(r, R"(\b30\b)");
  EXPECT_ERR_MATCHES(r, R"(\b4\b)");
}

TEST_F(BadInput, UnknownModel) {
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--model", "transformerxl"}));
  expect_error(r);
  EXPECT_ERR_HAS(r, "--model");
  EXPECT_ERR_HAS(r, "transformerxl");
}

// Mode flags are mapped to enums once, when parsed: a bad value fails there, naming the flag, the value and
// every choice, with exit 1 and before any work.
TEST_F(BadInput, ModeFlagsNameTheirChoices) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> flags = {
      {"--model", {"gpt", "mlp"}},
      {"--optimizer", {"adamw", "sgd", "lamb", "adafactor"}},
      {"--async", {"ps", "hogwild"}},
      {"--schedule", {"gpipe", "1f1b", "interleaved"}},
      {"--backend", {"auto", "shm", "mpi"}},
      {"--grad-comm-dtype", {"f32", "bf16"}},
      {"--precision", {"fp32", "bf16"}},
      {"--moe-second-policy", {"all", "random"}},
  };
  for (const auto& [flag, choices] : flags) {
    RunResult r = run_meshtrain(gpt_args(good_shard_, {flag, "nosuch"}));
    expect_error(r);
    EXPECT_ERR_HAS(r, flag);
    EXPECT_ERR_HAS(r, "'nosuch'");
    for (const std::string& c : choices) EXPECT_ERR_HAS(r, c);
  }
  // The spellings still parse (a value valid for the flag but not this run fails later, naming the flag).
  RunResult ok = run_meshtrain(gpt_args(good_shard_, {"--optimizer", "sgd", "--grad-comm-dtype", "bf16",
                                                      "--backend", "shm", "--moe-second-policy", "random"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();
  RunResult pp = run_meshtrain(gpt_args(good_shard_, {"--schedule", "interleaved"}));
  expect_error(pp);
  EXPECT_ERR_HAS(pp, "--schedule interleaved needs --pp > 1");
}

// --straggler is parsed once at the CLI into (rank, ms): a malformed value or a rank outside the job is an error
// naming the flag before anything runs; a good one slows its rank (the step takes at least MS).
TEST_F(BadInput, StragglerParsedOnceAndChecked) {
  for (const std::string v : {"x", "1:", ":5", "1:2:3", "-1:5", "1:-5", "99999999999:1", "1:5ms"}) {
    RunResult r = run_meshtrain(gpt_args(good_shard_, {"--straggler", v}));
    expect_error(r);
    EXPECT_ERR_HAS(r, "--straggler");
    EXPECT_ERR_HAS(r, "'" + v + "'");
  }
  RunResult far = run_meshtrain(gpt_args(good_shard_, {"--straggler", "3:5", "--nproc", "2"}));
  expect_error(far);
  EXPECT_ERR_HAS(far, "--straggler rank 3 does not exist");
  const auto t0 = std::chrono::steady_clock::now();
  RunResult ok = run_meshtrain(gpt_args(good_shard_, {"--straggler", "0:400"}));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();
  EXPECT_GE(s, 0.4) << "rank 0 should have slept 400 ms in its step";
}

TEST_F(BadInput, BatchNotDivisibleByMicroBatch) {
  RunResult r = run_meshtrain({"train", "--data",    good_shard_, "--n-layer",    "2",  "--n-head",
                               "2",     "--n-embd",  "32",        "--vocab-size", "64", "--n-positions",
                               "32",    "--seq-len", "16",        "--batch-size", "6",  "--micro-batch-size",
                               "4",     "--steps",   "1",         "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, "--batch-size");
  EXPECT_ERR_HAS(r, "--micro-batch-size");
  EXPECT_ERR_MATCHES(r, R"(\b6\b)");
  EXPECT_ERR_MATCHES(r, R"(\b4\b)");
}

TEST_F(BadInput, PipelineFlagCombinations) {
  // --stage-layers must describe the stages.
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {{"--nproc", "2", "--pp", "2", "--stage-layers", "1,1,0"}, {"--stage-layers gives 3 stage(s)", "has 2"}},
      {{"--nproc", "2", "--pp", "2", "--stage-layers", "1,2"}, {"--stage-layers adds up to 3", "n_layer 2"}},
      {{"--nproc", "2", "--pp", "2", "--stage-layers", "3,-1"}, {"stage 1 has -1 layers"}},
      {{"--stage-layers", "1,1"}, {"--stage-layers needs --pp > 1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags.back());
    RunResult r = run_meshtrain(gpt_args(good_shard_, c.flags));
    expect_error(r);
    for (const std::string& e : c.expect) EXPECT_ERR_HAS(r, e);
  }
  RunResult s = run_meshtrain(gpt_args(good_shard_, {"--schedule", "1f1b"}));
  expect_error(s);
  EXPECT_ERR_HAS(s, "--schedule 1f1b needs --pp > 1");
  RunResult p = run_meshtrain(gpt_args(good_shard_, {"--pp", "2"}));  // one rank
  expect_error(p);
  EXPECT_ERR_HAS(p, "--pp 2");
}

TEST_F(BadInput, TensorParallelDegreeMustDivideRanksAndHeads) {
  RunResult r = run_meshtrain(gpt_args(good_shard_, {"--tp", "2"}));  // one rank
  expect_error(r);
  EXPECT_ERR_HAS(r, "--tp 2");
  EXPECT_ERR_HAS(r, "not divisible");
  // The tiny GPT has 2 heads: 3 tensor-parallel ranks cannot split them.
  RunResult h = run_meshtrain(gpt_args(good_shard_, {"--nproc", "3", "--tp", "3"}));
  expect_error(h);
  EXPECT_ERR_HAS(h, "n_head (2) is not divisible by --tp (3)");
}

class BadMlpInput : public BadInput {
 protected:
  void write_images(const std::string& path, int count) {
    IdxImages im{count, 4, 4, std::vector<uint8_t>((size_t)count * 16, 100)};
    write_idx_images(path, im);
  }
};

TEST_F(BadMlpInput, ImageLabelCountMismatch) {
  std::string img = dir_ / "img.idx", lab = dir_ / "lab.idx";
  write_images(img, 20);
  write_idx_labels(lab, IdxLabels{std::vector<uint8_t>(19, 3)});
  RunResult r = run_meshtrain({"train", "--model", "mlp", "--data", img, "--labels", lab, "--hidden", "8",
                               "--batch-size", "4", "--steps", "1", "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, img);
  EXPECT_ERR_HAS(r, lab);
  EXPECT_ERR_MATCHES(r, R"(\b20\b)");
  EXPECT_ERR_MATCHES(r, R"(\b19\b)");
}

// The MESHTRAIN_* environment variables are parsed strictly (core/env.h): a value that is not one of the
// accepted forms stops the run with the variable's name instead of being read as the default.
TEST_F(BadInput, EnvironmentVariablesWithBadValuesAreNamed) {
  struct Case {
    const char* name;
    const char* value;
    std::vector<std::string> flags;
  };
  const std::vector<Case> cases = {
      {"MESHTRAIN_SHM_STREAM", "yes", {"--nproc", "2"}},
      {"MESHTRAIN_SHM_CMA", "off", {"--nproc", "2"}},
      {"MESHTRAIN_SHM_SPIN", "300", {"--nproc", "2"}},
      {"MESHTRAIN_SHM_SPIN", "300,-1", {"--nproc", "2"}},
      {"MESHTRAIN_SHM_SLOT_KB", "64k", {"--nproc", "2"}},
      {"MESHTRAIN_CHECK_GRAD_WRITES", "2", {}},
  };
  for (const Case& c : cases) {
    ::setenv(c.name, c.value, 1);
    RunResult r = run_meshtrain(gpt_args(good_shard_, c.flags));
    ::unsetenv(c.name);
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    EXPECT_FALSE(r.timed_out) << r.describe();
    EXPECT_EQ(r.term_signal, 0) << r.describe();
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_ERR_HAS(r, std::string(c.name) + "=" + c.value);
  }
  // Positive control: the accepted values run.
  ::setenv("MESHTRAIN_SHM_STREAM", "1", 1);
  ::setenv("MESHTRAIN_SHM_SPIN", "50,500", 1);
  ::setenv("MESHTRAIN_CHECK_GRAD_WRITES", "1", 1);
  RunResult ok = run_meshtrain(gpt_args(good_shard_, {"--nproc", "2"}));
  for (const char* n : {"MESHTRAIN_SHM_STREAM", "MESHTRAIN_SHM_SPIN", "MESHTRAIN_CHECK_GRAD_WRITES"}) ::unsetenv(n);
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();
}

TEST_F(BadMlpInput, LabelNotBelowTenClasses) {
  std::string img = dir_ / "img.idx", lab = dir_ / "lab.idx";
  write_images(img, 20);
  std::vector<uint8_t> labels(20);
  for (int i = 0; i < 20; i++) labels[i] = (uint8_t)(i % 10);
  labels[13] = 12;
  write_idx_labels(lab, IdxLabels{labels});
  RunResult r = run_meshtrain({"train", "--model", "mlp", "--data", img, "--labels", lab, "--hidden", "8",
                               "--batch-size", "4", "--steps", "1", "--quiet"});
  expect_error(r);
  EXPECT_ERR_HAS(r, lab);
  EXPECT_ERR_MATCHES(r, R"(\b12\b)");
  EXPECT_ERR_MATCHES(r, R"(\b13\b)");
}

}  // namespace
}  // namespace mt::clitest
