// Resume bit-identity: a run stopped at step 6 and resumed from its checkpoint must reproduce the
// uninterrupted run exactly -- every step's loss, lr and grad_norm as printed, and the final weights bit for
// bit -- and leave the checkpoint directory clean (latest -> a complete checkpoint, no *.tmp.* leftovers).
#include <cstring>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

void check_resume_identical(const std::string& optimizer) {
  TempDir dir;
  const std::string shard = dir / "data.bin", ckpt = dir / "ckpt";
  make_random_shard(shard, 5000, 64, 42);
  const std::vector<std::string> common =
      concat({"train", "--data",         shard,     "--seq-len",      "16",  "--batch-size", "4",   "--steps",
              "12",    "--warmup-steps", "3",       "--weight-decay", "0.1", "--grad-clip",  "1.0", "--lr",
              "3e-3",  "--optimizer",    optimizer, "--quiet"},
             tiny_gpt_flags());

  const std::string a_metrics = dir / "A.jsonl", a_weights = dir / "A.safetensors";
  RunResult a = run_meshtrain(concat(common, {"--metrics", a_metrics, "--save", a_weights}));
  ASSERT_EQ(a.exit_code, 0) << a.describe();

  const std::string b_metrics = dir / "B.jsonl", b_weights = dir / "B.safetensors";
  RunResult b1 = run_meshtrain(
      concat(common, {"--checkpoint-dir", ckpt, "--save-every", "4", "--stop-at-step", "6", "--metrics", b_metrics}));
  ASSERT_EQ(b1.exit_code, 0) << b1.describe();
  EXPECT_EQ(read_lines(b_metrics).size(), 6u) << "--stop-at-step 6 should run exactly 6 steps";
  EXPECT_EQ(trim(slurp(ckpt + "/latest")), "step_00000006") << "--stop-at-step 6 should leave a checkpoint at 6";
  EXPECT_FALSE(fs::exists(b_weights)) << "--save was not given to the first process";

  RunResult b2 = run_meshtrain(concat(common, {"--checkpoint-dir", ckpt, "--save-every", "4", "--resume", ckpt,
                                               "--metrics", b_metrics, "--save", b_weights}));
  ASSERT_EQ(b2.exit_code, 0) << b2.describe();

  // Metrics: same steps, and loss / lr / grad_norm printed identically.
  std::vector<std::string> ra = read_lines(a_metrics), rb = read_lines(b_metrics);
  ASSERT_EQ(ra.size(), 12u);
  ASSERT_EQ(rb.size(), 12u) << "B.jsonl should hold steps 0-5 of the first process and 6-11 of the second";
  for (size_t i = 0; i < ra.size(); i++) {
    SCOPED_TRACE("row " + std::to_string(i) + "\nA: " + ra[i] + "\nB: " + rb[i]);
    auto ja = nlohmann::json::parse(ra[i]), jb = nlohmann::json::parse(rb[i]);
    EXPECT_EQ(ja["step"].get<int64_t>(), (int64_t)i);
    EXPECT_EQ(jb["step"].get<int64_t>(), (int64_t)i);
    for (const char* key : {"loss", "lr", "grad_norm"}) {
      std::string na = raw_json_number(ra[i], key), nb = raw_json_number(rb[i], key);
      EXPECT_FALSE(na.empty()) << key;
      EXPECT_EQ(na, nb) << key;
      double da = ja[key].get<double>(), db = jb[key].get<double>();
      EXPECT_EQ(std::memcmp(&da, &db, sizeof da), 0) << key << ": " << da << " vs " << db;
    }
  }
  // Sanity of the premise: training changed something (lr is not constant, loss moved).
  EXPECT_NE(raw_json_number(ra[0], "loss"), raw_json_number(ra[11], "loss"));

  // Final weights: same tensors, identical bits.
  auto wa = read_all_f32(a_weights), wb = read_all_f32(b_weights);
  ASSERT_EQ(wa.size(), wb.size());
  ASSERT_FALSE(wa.empty());
  for (auto& [name, va] : wa) {
    auto it = wb.find(name);
    ASSERT_NE(it, wb.end()) << name << " missing in B";
    ASSERT_EQ(va.size(), it->second.size()) << name;
    size_t differing = 0;
    for (size_t i = 0; i < va.size(); i++) differing += std::memcmp(&va[i], &it->second[i], sizeof(float)) != 0;
    EXPECT_EQ(differing, 0u) << name << ": " << differing << " of " << va.size() << " values differ";
  }

  // The checkpoint directory: latest -> complete final checkpoint, no temporaries left.
  std::string latest = trim(slurp(ckpt + "/latest"));
  EXPECT_EQ(latest, "step_00000012");
  EXPECT_TRUE(is_complete_checkpoint(fs::path(ckpt) / latest));
  auto st = nlohmann::json::parse(slurp(ckpt + "/" + latest + "/state.json"));
  EXPECT_EQ(st["step"].get<int64_t>(), 12);
  for (auto& e : fs::directory_iterator(ckpt)) {
    std::string n = e.path().filename().string();
    EXPECT_EQ(n.find(".tmp."), std::string::npos) << "leftover temporary " << e.path();
    if (e.is_directory()) {
      EXPECT_TRUE(is_complete_checkpoint(e.path()));
    }
  }
}

TEST(Resume, AdamWStopAndResumeIsBitIdentical) { check_resume_identical("adamw"); }

TEST(Resume, SgdStopAndResumeIsBitIdentical) { check_resume_identical("sgd"); }

}  // namespace
}  // namespace mt::clitest
