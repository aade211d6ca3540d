// --precision fp32|bf16 end to end: --help explains it beside --grad-comm-dtype; a bad MESHTRAIN_BF16_EMULATE
// is an error naming it; the first line names the bf16 path; GPT and MLP products change with it (first-step
// loss, everything else equal); checkpoints stay float32, so a bf16 run resumes bit for bit in bf16 and
// continues in fp32. (Bad --precision values: bad_input_test's ModeFlagsNameTheirChoices. The rule itself:
// tests/parity/test_bf16_parity.py and test_bf16_layouts.py.)
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "data/idx.h"
#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

std::vector<std::string> gpt_common(const std::string& shard, int steps) {
  return concat({"train", "--data", shard, "--seq-len", "16", "--batch-size", "4", "--steps", std::to_string(steps),
                 "--warmup-steps", "3", "--lr", "3e-3", "--quiet"},
                tiny_gpt_flags());
}

double first_loss(const std::string& metrics) {
  std::vector<std::string> rows = read_lines(metrics);
  EXPECT_FALSE(rows.empty()) << metrics;
  return rows.empty() ? 0.0 : nlohmann::json::parse(rows[0])["loss"].get<double>();
}

struct EnvVar {  // sets a variable for one scope (the child inherits it)
  explicit EnvVar(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvVar() { unsetenv(name_); }
  const char* name_;
};

TEST(Precision, HelpExplainsItBesideGradCommDtype) {
  RunResult h = run_meshtrain({"train", "--help"});
  ASSERT_EQ(h.exit_code, 0) << h.describe();
  const size_t p = h.out.find("--precision"), g = h.out.find("--grad-comm-dtype");
  ASSERT_NE(p, std::string::npos) << h.out;
  ASSERT_NE(g, std::string::npos) << h.out;
  EXPECT_LT(p > g ? p - g : g - p, 1200u) << "the two flags should be explained side by side";
  for (const char* s : {"bfloat16", "float32", "independent of --precision", "emulated", "checkpoints"})
    EXPECT_TRUE(contains(h.out, s)) << s;
}

TEST(Precision, BadEmulateVariableIsAnError) {
  TempDir dir;
  make_random_shard(dir / "d.bin", 3000, 64);
  EnvVar env("MESHTRAIN_BF16_EMULATE", "yes");
  RunResult r = run_meshtrain(concat(gpt_common(dir / "d.bin", 2), {"--precision", "bf16"}));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_TRUE(contains(r.err, "MESHTRAIN_BF16_EMULATE=yes")) << r.err;
  EXPECT_TRUE(contains(r.err, "0 or 1")) << r.err;
}

TEST(Precision, FirstLineNamesThePath) {
  TempDir dir;
  make_random_shard(dir / "d.bin", 3000, 64);
  auto args = gpt_common(dir / "d.bin", 1);
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  {
    EnvVar env("MESHTRAIN_BF16_EMULATE", "1");
    RunResult r = run_meshtrain(concat(args, {"--precision", "bf16"}));
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_TRUE(contains(r.err.substr(0, r.err.find('\n')), "bf16: emulated")) << r.err;
  }
  RunResult r = run_meshtrain(concat(args, {"--precision", "bf16"}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_TRUE(contains(first, "bf16: avx512_core_bf16") || contains(first, "bf16: avx512_core_amx") ||
              contains(first, "bf16: emulated"))
      << first;
}

// The same run in both precisions: the first loss moves by the rounding (>1e-6 relative) but stays close
// (<1e-2); a precision flag that reached no product would leave it bit-identical.
TEST(Precision, GptAndMlpProductsFollowTheFlag) {
  TempDir dir;
  make_random_shard(dir / "d.bin", 3000, 64);
  std::map<std::string, double> gpt;
  for (const char* p : {"fp32", "bf16"}) {
    const std::string m = dir / (std::string("gpt_") + p + ".jsonl");
    RunResult r = run_meshtrain(concat(gpt_common(dir / "d.bin", 1), {"--precision", p, "--metrics", m}));
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    gpt[p] = first_loss(m);
  }
  EXPECT_GT(std::fabs(gpt["bf16"] - gpt["fp32"]), 1e-6 * gpt["fp32"]);
  EXPECT_LT(std::fabs(gpt["bf16"] - gpt["fp32"]), 1e-2 * gpt["fp32"]);

  std::mt19937 gen(3);
  IdxImages im{256, 8, 8, std::vector<uint8_t>(256 * 64)};
  IdxLabels lab;
  for (auto& px : im.pixels) px = (uint8_t)(gen() % 256);
  for (int i = 0; i < 256; i++) lab.labels.push_back((uint8_t)(gen() % 10));
  write_idx_images(dir / "img.idx", im);
  write_idx_labels(dir / "lab.idx", lab);
  std::map<std::string, double> mlp;
  for (const char* p : {"fp32", "bf16"}) {
    const std::string m = dir / (std::string("mlp_") + p + ".jsonl");
    RunResult r =
        run_meshtrain({"train", "--model", "mlp", "--data", dir / "img.idx", "--labels", dir / "lab.idx", "--hidden",
                       "32", "--steps", "1", "--batch-size", "32", "--precision", p, "--metrics", m, "--quiet"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    mlp[p] = first_loss(m);
  }
  EXPECT_GT(std::fabs(mlp["bf16"] - mlp["fp32"]), 1e-6 * mlp["fp32"]);
  EXPECT_LT(std::fabs(mlp["bf16"] - mlp["fp32"]), 1e-2 * mlp["fp32"]);
}

// Under bf16 the inputs that backward reads only through products (ln1, atty, ln2, gelu(fch): (2 C + C/S + 4 C/S)
// per row and block, and the final LayerNorm's output) are kept in bf16, half their bytes, at the cost of one N x C
// float32 scratch (and under SP one N x C bf16 scratch, the LayerNorm outputs' bf16 all-gather): the measured
// activation peak and the estimate both drop by exactly that, dense, tp 2 (same widths, split) and tp 2 with SP
// (LayerNorm outputs of N / 2 rows).
TEST(Precision, ProductOnlyInputsAreKeptInBf16) {
  TempDir dir;
  make_random_shard(dir / "d.bin", 3000, 64);
  const double L = 2, N = 4 * 16, C = 32;
  auto bytes = [&](const char* p, const std::vector<std::string>& extra) {
    const std::string s = dir / (std::string("summary_") + p + ".json");
    RunResult r =
        run_meshtrain(concat(concat(gpt_common(dir / "d.bin", 1), {"--precision", p, "--summary", s}), extra));
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    const nlohmann::json rank = nlohmann::json::parse(slurp(s))["ranks"][0];
    return std::pair<double, double>{rank["activation_peak_bytes"].get<double>(),
                                     rank["activation_bytes"].get<double>()};
  };
  struct Case {
    std::vector<std::string> extra;
    double saved;  // bytes
  };
  // Per block: ln1, ln2 (C each), qkv (3C), atty (C) and gelu(fch) (4C) halved, their local widths under tp; and
  // the final LayerNorm's output (C); less the blocks' float32 scratch for them, N x max(C, local 3C) floats.
  const std::vector<Case> cases = {
      {{}, L * (2 * C + 3 * C + C + 4 * C) * N * 2 + N * C * 2 - N * 3 * C * 4},
      {{"--nproc", "2", "--tp", "2"}, L * (2 * C + (3 * C + C + 4 * C) / 2) * N * 2 + N * C * 2 - N * C * 1.5 * 4},
      // tp 2 + SP: ln1, ln2 and lnf of this rank's N / 2 rows, qkv, atty and gelu(fch) of its widths, halved; less
      // the float32 scratch and the bf16 gather scratch (N x C)
      {{"--nproc", "2", "--tp", "2", "--sequence-parallel"},
       L * (2 * C / 2 + (3 * C + C + 4 * C) / 2) * N * 2 + N / 2 * C * 2 - N * C * 1.5 * 4 - N * C * 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra.empty() ? std::string("single") : c.extra.back());
    const auto [peak32, est32] = bytes("fp32", c.extra);
    const auto [peak16, est16] = bytes("bf16", c.extra);
    EXPECT_EQ(peak32 - peak16, c.saved);
    EXPECT_EQ(est32 - est16, c.saved);
  }
}

// Master weights and checkpoints are float32: a bf16 run stopped at step 6 resumes bit for bit in bf16, and
// the same checkpoint continues in fp32 (other products, so other numbers from step 6 on).
TEST(Precision, CheckpointsResumeInEitherPrecision) {
  TempDir dir;
  const std::string shard = dir / "d.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 42);
  const auto bf16 = concat(gpt_common(shard, 12), {"--precision", "bf16"});
  RunResult a = run_meshtrain(concat(bf16, {"--metrics", dir / "A.jsonl", "--save", dir / "A.safetensors"}));
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  {
    mt::SafetensorsReader saved(dir / "A.safetensors");
    ASSERT_FALSE(saved.tensors().empty());
    for (const mt::TensorInfo& t : saved.tensors()) EXPECT_EQ(t.dtype, mt::DType::F32) << t.name;
  }
  RunResult b1 = run_meshtrain(concat(
      bf16, {"--checkpoint-dir", ckpt, "--save-every", "6", "--stop-at-step", "6", "--metrics", dir / "B.jsonl"}));
  ASSERT_EQ(b1.exit_code, 0) << b1.describe();
  fs::copy(ckpt, dir / "ckpt_fp32", fs::copy_options::recursive);
  RunResult b2 = run_meshtrain(concat(bf16, {"--checkpoint-dir", ckpt, "--resume", ckpt, "--metrics", dir / "B.jsonl",
                                             "--save", dir / "B.safetensors"}));
  ASSERT_EQ(b2.exit_code, 0) << b2.describe();
  EXPECT_EQ(slurp(dir / "A.safetensors"), slurp(dir / "B.safetensors")) << "bf16 resume is not bit-identical";

  auto fp32 = gpt_common(shard, 12);
  RunResult c = run_meshtrain(concat(fp32, {"--checkpoint-dir", dir / "ckpt_fp32", "--resume", dir / "ckpt_fp32",
                                            "--metrics", dir / "C.jsonl", "--save", dir / "C.safetensors"}));
  ASSERT_EQ(c.exit_code, 0) << c.describe();
  std::vector<std::string> ra = read_lines(dir / "A.jsonl"), rc = read_lines(dir / "C.jsonl");
  ASSERT_EQ(ra.size(), 12u);
  ASSERT_EQ(rc.size(), 6u) << "a fresh metrics file holds the resumed steps 6-11";
  ASSERT_EQ(nlohmann::json::parse(rc[0])["step"].get<int64_t>(), 6);
  const double la = nlohmann::json::parse(ra[6])["loss"].get<double>();
  const double lc = nlohmann::json::parse(rc[0])["loss"].get<double>();
  EXPECT_NE(la, lc) << "step 6 in fp32 should differ from bf16";
  EXPECT_NEAR(la, lc, 1e-2 * la) << "the fp32 continuation should start from the bf16 run's weights";
}

}  // namespace
}  // namespace mt::clitest
