// MLP end to end on a synthetic, learnable IDX data set: 8x8 images where class k has a bright 2x2 block in
// slot k of a 4x4 grid of slots, on a noisy background. A small MLP must reach >= 90% held-out accuracy in
// 200 steps (chance is 10%); with labels that carry no information it must stay near chance.
#include <random>

#include "tests/cli/cli_test_util.h"

namespace mt::clitest {
namespace {

struct Dataset {
  IdxImages images;
  IdxLabels labels;
};

Dataset make_blocks(int count, uint32_t seed, bool random_labels = false) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> cls(0, 9), bg(0, 90), fg(170, 255);
  Dataset d;
  d.images = IdxImages{count, 8, 8, std::vector<uint8_t>((size_t)count * 64)};
  d.labels.labels.resize(count);
  for (int i = 0; i < count; i++) {
    int k = cls(gen);
    uint8_t* px = &d.images.pixels[(size_t)i * 64];
    for (int j = 0; j < 64; j++) px[j] = (uint8_t)bg(gen);
    int r0 = (k / 4) * 2, c0 = (k % 4) * 2;
    for (int r = r0; r < r0 + 2; r++)
      for (int c = c0; c < c0 + 2; c++) px[r * 8 + c] = (uint8_t)fg(gen);
    d.labels.labels[i] = (uint8_t)(random_labels ? cls(gen) : k);
  }
  return d;
}

void write_dataset(const Dataset& d, const std::string& images, const std::string& labels) {
  write_idx_images(images, d.images);
  write_idx_labels(labels, d.labels);
}

std::vector<std::string> mlp_args(const std::string& images, const std::string& labels, const std::string& metrics) {
  return {"train", "--model",      "mlp", "--data", images, "--labels",     labels, "--hidden",  "32",    "--steps",
          "200",   "--batch-size", "32",  "--lr",   "0.01", "--eval-every", "100",  "--metrics", metrics, "--quiet"};
}

// The val_accuracy of the rows at steps 99 and 199 (the evaluations); checks there are no others.
std::vector<double> val_accuracies(const std::string& metrics) {
  std::vector<double> acc;
  std::vector<std::string> rows = read_lines(metrics);
  EXPECT_EQ(rows.size(), 200u);
  for (const std::string& line : rows) {
    auto j = nlohmann::json::parse(line);
    int64_t step = j["step"].get<int64_t>();
    bool eval_step = step == 99 || step == 199;
    EXPECT_EQ(j.contains("val_accuracy"), eval_step) << line;
    if (j.contains("val_accuracy")) {
      double a = j["val_accuracy"].get<double>();
      EXPECT_GE(a, 0.0);
      EXPECT_LE(a, 1.0);
      EXPECT_TRUE(j.contains("val_loss")) << line;
      acc.push_back(a);
    }
  }
  return acc;
}

TEST(Mlp, LearnsSyntheticBlocksWithValFraction) {
  TempDir dir;
  const std::string img = dir / "train-images.idx", lab = dir / "train-labels.idx", metrics = dir / "m.jsonl";
  write_dataset(make_blocks(2000, 1), img, lab);
  RunResult r = run_meshtrain(mlp_args(img, lab, metrics));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<double> acc = val_accuracies(metrics);
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_GE(acc.back(), 0.9) << "final val_accuracy";
  auto first = nlohmann::json::parse(read_lines(metrics).front());
  auto last = nlohmann::json::parse(read_lines(metrics).back());
  EXPECT_LT(last["loss"].get<double>(), first["loss"].get<double>()) << "training loss should fall";
}

TEST(Mlp, LearnsSyntheticBlocksWithSeparateValFiles) {
  TempDir dir;
  const std::string img = dir / "train-images.idx", lab = dir / "train-labels.idx";
  const std::string vimg = dir / "val-images.idx", vlab = dir / "val-labels.idx", metrics = dir / "m.jsonl";
  write_dataset(make_blocks(2000, 1), img, lab);
  write_dataset(make_blocks(500, 99), vimg, vlab);
  RunResult r = run_meshtrain(concat(mlp_args(img, lab, metrics), {"--val-data", vimg, "--val-labels", vlab}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<double> acc = val_accuracies(metrics);
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_GE(acc.back(), 0.9) << "final val_accuracy";
  // Accuracy is a fraction of the 500 held-out examples.
  double n_correct = acc.back() * 500;
  EXPECT_NEAR(n_correct, std::round(n_correct), 1e-6);
}

TEST(Mlp, UninformativeLabelsStayNearChance) {
  // Control for the two tests above: the accuracy is not high for reasons other than learning.
  TempDir dir;
  const std::string img = dir / "train-images.idx", lab = dir / "train-labels.idx";
  const std::string vimg = dir / "val-images.idx", vlab = dir / "val-labels.idx", metrics = dir / "m.jsonl";
  write_dataset(make_blocks(2000, 1, /*random_labels=*/true), img, lab);
  write_dataset(make_blocks(500, 99, /*random_labels=*/true), vimg, vlab);
  RunResult r = run_meshtrain(concat(mlp_args(img, lab, metrics), {"--val-data", vimg, "--val-labels", vlab}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<double> acc = val_accuracies(metrics);
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_LT(acc.back(), 0.25);
}

}  // namespace
}  // namespace mt::clitest

namespace mt::clitest {
namespace {

// The MLP under data parallelism (2 and 3 ranks, ZeRO 0 and 3) follows the single-process run: every step's
// loss within 1e-5 and the same evaluation accuracy (held-out chunks are dealt to ranks and summed).
TEST(Mlp, DataParallelMatchesSingleProcess) {
  TempDir dir;
  const std::string img = dir / "train-images.idx", lab = dir / "train-labels.idx";
  write_dataset(make_blocks(600, 3), img, lab);
  auto run = [&](const std::vector<std::string>& extra, const std::string& metrics) {
    std::vector<std::string> a = mlp_args(img, lab, metrics);
    a[10] = "60";  // --steps
    a[16] = "30";  // --eval-every
    a[12] = "12";  // --batch-size, divisible by 2 and 3
    a.insert(a.end(), extra.begin(), extra.end());
    RunResult r = run_meshtrain(a);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    std::vector<nlohmann::json> rows;
    for (const std::string& line : read_lines(metrics)) rows.push_back(nlohmann::json::parse(line));
    return rows;
  };
  auto ref = run({}, dir / "single.jsonl");
  ASSERT_EQ(ref.size(), 60u);
  for (auto [n, z] : std::vector<std::pair<int, int>>{{2, 0}, {3, 3}}) {
    SCOPED_TRACE("nproc " + std::to_string(n) + " zero " + std::to_string(z));
    auto got = run({"--nproc", std::to_string(n), "--zero", std::to_string(z)}, dir / ("dp" + std::to_string(n) + ".jsonl"));
    ASSERT_EQ(got.size(), ref.size());
    for (size_t s = 0; s < ref.size(); s++) {
      EXPECT_NEAR(got[s]["loss"].get<double>(), ref[s]["loss"].get<double>(), 1e-5) << "step " << s;
      if (ref[s].contains("val_accuracy")) {
        EXPECT_EQ(got[s]["val_accuracy"].get<double>(), ref[s]["val_accuracy"].get<double>()) << "step " << s;
      }
    }
  }
}

}  // namespace
}  // namespace mt::clitest
